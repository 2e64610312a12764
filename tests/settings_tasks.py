"""Settings of the ``db_worker`` processes of ``tests/test_django_tasks.py``: ``tests.settings``
with the ``django-tasks`` backport's database backend on a SQLite file (``REDLOCK_TEST_DB``) and
the lock masters (``REDLOCK_TEST_NODES``) from the environment. The test process applies the same
``INSTALLED_APPS``, ``TASKS`` and ``TASKS_DATABASE`` to itself (``override_settings`` and a
connection of its own), so this module imports without those variables too."""

import os

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS as _APPS

INSTALLED_APPS = [*_APPS, "django_tasks", "django_tasks_db"]
TASKS = {
    "default": {
        "BACKEND": "django_tasks_db.DatabaseBackend",
        # "nowhere": a queue no worker reads (a task that waits for ever, as far as a key knows).
        "QUEUES": ["default", "nowhere"],
    }
}
#: One SQLite file shared by the workers and the test: WAL lets readers in while one writes, and a
#: writer waits up to 30 s for another (a loaded machine) instead of failing at once.
TASKS_DATABASE = {
    "ENGINE": "django.db.backends.sqlite3",
    "NAME": os.environ.get("REDLOCK_TEST_DB", ""),
    "OPTIONS": {"timeout": 30, "init_command": "PRAGMA journal_mode=WAL;"},
}
DATABASES = {"default": TASKS_DATABASE}
REDLOCK = {"NODES": [url for url in os.environ.get("REDLOCK_TEST_NODES", "").split(",") if url]}
