"""Settings for ``manage.py`` subprocesses started by the tests: ``tests.settings`` plus the lock
masters (``REDLOCK_TEST_NODES``, comma-separated URLs) and a SQLite file
(``REDLOCK_TEST_DB``) from the environment, since a subprocess cannot see the test's fixtures."""

import os

from tests.settings import *  # noqa: F403

REDLOCK = {
    **REDLOCK,  # noqa: F405 (tests.settings': REDLOCK_TEST_NODE_TIMEOUT, where asked)
    "NODES": [url for url in os.environ["REDLOCK_TEST_NODES"].split(",") if url],
}
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["REDLOCK_TEST_DB"]}
}
