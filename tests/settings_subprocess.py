"""Settings for ``manage.py`` subprocesses started by the tests: ``tests.settings`` plus the lock
masters (``REDLOCK_TEST_NODES``, comma-separated URLs) and a SQLite file
(``REDLOCK_TEST_DB``) from the environment, since a subprocess cannot see the test's fixtures."""

import os

from tests.settings import *  # noqa: F403

REDLOCK = {"NODES": [url for url in os.environ["REDLOCK_TEST_NODES"].split(",") if url]}
if os.environ.get("REDLOCK_TEST_NODE_TIMEOUT"):  # a budget for a loaded machine, where asked
    REDLOCK["NODE_TIMEOUT"] = float(os.environ["REDLOCK_TEST_NODE_TIMEOUT"])
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["REDLOCK_TEST_DB"]}
}
