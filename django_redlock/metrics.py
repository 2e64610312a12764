"""The first path of ``contrib/prometheus.py``: ``from django_redlock import metrics`` and
``metrics.enabled()`` in a project's /metrics view (as that module's docstring and the demo
project showed it) keep working."""

from .contrib.prometheus import enabled

__all__ = ["enabled"]
