"""Turns engine events into Django signals and log records."""

from __future__ import annotations

import logging

from .engine import Lock, LockLost, LockNotAcquired
from .signals import lock_acquired, lock_contended, lock_lost, lock_released

logger = logging.getLogger("django_redlock")


class DjangoObserver:
    def acquired(self, lock: Lock, *, waited: float, attempts: int) -> None:
        logger.debug("acquired %r after %.3fs (%d attempts)", lock.resource, waited, attempts)
        lock_acquired.send_robust(Lock, lock=lock, waited=waited, attempts=attempts)

    def not_acquired(self, lock: Lock, *, waited: float, error: LockNotAcquired) -> None:
        logger.info("not acquired %r after %.3fs: %s", lock.resource, waited, error)
        lock_contended.send_robust(Lock, lock=lock, waited=waited, error=error)

    def released(self, lock: Lock, *, held: float) -> None:
        logger.debug("released %r after %.3fs", lock.resource, held)
        lock_released.send_robust(Lock, lock=lock, held=held)

    def lost(self, lock: Lock, *, error: LockLost) -> None:
        logger.warning("LOST %s", error)
        lock_lost.send_robust(Lock, lock=lock, error=error)
