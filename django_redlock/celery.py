"""The first path of ``contrib/celery.py`` (``from django_redlock.celery import RedlockTask``),
kept working: the same classes, imported rather than copied, so that Celery's signal receiver
is connected once whichever path a project imports."""

from .contrib.celery import AlreadyQueued, RedlockTask

__all__ = ["AlreadyQueued", "RedlockTask"]
