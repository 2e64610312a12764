"""A guarded command and a ``RedlockTask`` for tests/transaction_checks.py, in a module of their
own: a guarded command's lock is named after its module (``command:transaction_tasks``)."""

from __future__ import annotations

from celery import Celery
from django.core.management.base import BaseCommand
from django.db.models import F

from django_redlock.commands import GuardedCommandMixin
from django_redlock.contrib.celery import RedlockTask
from tests.fencedapp.models import Ledger

app = Celery("redlock_transaction_tests", broker="memory://")


class Command(GuardedCommandMixin, BaseCommand):
    def handle(self, *args: object, **options: object) -> None:
        Ledger.objects.filter(name="service").update(value=4)


@app.task(base=RedlockTask, lock_key="bump:{name}", lock_unique=False)
def bump(name: str) -> str:
    """Called directly (inside the caller's transaction): its run lock, not a worker, is what
    the check looks at."""
    Ledger.objects.filter(name=name).update(value=F("value") + 1)
    return "bumped"
