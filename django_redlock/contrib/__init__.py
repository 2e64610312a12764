"""Integrations with other libraries, each an extra of its own (``pip install
'django-redlock[celery]'``); none is needed to lock, and the engine never imports them.

Imported by a project that uses them:

- ``celery``: ``RedlockTask``, Celery tasks that run once per key (also importable from its
  first path, ``django_redlock.celery``);
- ``tasks``: ``@unique_task``, the same for Django's tasks framework;
- ``health_check``: the masters as one check of django-health-check.

Called by every lock of the Django layer, and doing nothing (importing nothing but a cached
lookup) when their library is not installed:

- ``otel``: OpenTelemetry spans around acquire, extend and release;
- ``prometheus`` (with ``histograms``, its wait and hold histograms): Prometheus metrics
  (``enabled()`` also importable from its first path, ``django_redlock.metrics``).

These two import only the engine (tests/test_package_layout.py checks it), so the lock's own path
never imports Celery's, django-tasks' or django-health-check's code.
"""
