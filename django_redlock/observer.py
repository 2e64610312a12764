"""Turns engine events into Django signals, log records and Prometheus metrics.

Log records go to the ``django_redlock`` logger: DEBUG for acquired/released, INFO for a lock not
acquired (contention is normal), ERROR for a lost lease (exclusivity may have been broken). They
name the resource and the lock's label, never its token.
"""

from __future__ import annotations

import logging

from . import metrics
from .engine import Lock, LockLost, LockNotAcquired
from .signals import lock_acquired, lock_contended, lock_lost, lock_released

logger = logging.getLogger("django_redlock")


def _name(lock: Lock) -> str:
    return f"{lock.resource!r}" + (f" ({lock.label})" if lock.label else "")


class DjangoObserver:
    def acquired(self, lock: Lock, *, waited: float, attempts: int) -> None:
        logger.debug("acquired %s after %.3fs (%d attempts)", _name(lock), waited, attempts)
        metrics.acquired(waited)
        lock_acquired.send_robust(Lock, lock=lock, waited=waited, attempts=attempts)

    def not_acquired(self, lock: Lock, *, waited: float, error: LockNotAcquired) -> None:
        logger.info("not acquired %s after %.3fs: %s", _name(lock), waited, error)
        metrics.not_acquired(waited, error)
        lock_contended.send_robust(Lock, lock=lock, waited=waited, error=error)

    def released(self, lock: Lock, *, held: float) -> None:
        logger.debug("released %s after %.3fs", _name(lock), held)
        metrics.released(held)
        lock_released.send_robust(Lock, lock=lock, held=held)

    def lost(self, lock: Lock, *, error: LockLost) -> None:
        logger.error("LOST %s: %s", _name(lock), error)
        metrics.lost()
        lock_lost.send_robust(Lock, lock=lock, error=error)
