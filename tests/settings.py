"""Settings for the test suite. REDLOCK["NODES"] is filled per test by fixtures that start real
redis-server processes (see conftest.py). Child processes started by tests get their masters and
a shared SQLite file through REDLOCK_NODES and REDLOCK_TEST_DB."""

import os

# The demo site's apps, middleware, templates and URLs: the tests drive the same site.
from testproject.settings import *  # noqa: E402, F403
from testproject.settings import INSTALLED_APPS as DEMO_APPS  # noqa: E402

SECRET_KEY = "tests-only-not-secret"  # noqa: S105
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
INSTALLED_APPS = [*DEMO_APPS, "tests.fencedapp"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("REDLOCK_TEST_DB", ":memory:"),
    }
}
if os.environ.get("REDLOCK_TEST_PG"):  # a child on the throwaway cluster of tests/postgres.py
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": "postgres",
            "USER": "postgres",
            "HOST": "127.0.0.1",
            "PORT": os.environ["REDLOCK_TEST_PG"],
        }
    }
# Filled in by the ``redlock_settings`` fixture (or REDLOCK_NODES for child processes); empty
# here, so a test that forgets it fails with E001 instead of touching a developer's local Redis.
REDLOCK = {"NODES": [n for n in os.environ.get("REDLOCK_NODES", "").split(",") if n]}
if os.environ.get("REDLOCK_TEST_NODE_TIMEOUT"):  # a budget for a loaded machine, where asked
    REDLOCK["NODE_TIMEOUT"] = float(os.environ["REDLOCK_TEST_NODE_TIMEOUT"])
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"null": {"class": "logging.NullHandler"}},
    "loggers": {"django_redlock": {"handlers": ["null"], "level": "DEBUG"}},
}
