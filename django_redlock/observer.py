"""Turns engine events into Django signals, log records, Prometheus metrics and the attributes
of OpenTelemetry spans (``contrib/otel.py``).

Log records go to the ``django_redlock`` logger: DEBUG for acquired/released, INFO for a lock not
acquired (contention is normal), ERROR for a lost lease (exclusivity may have been broken). They
name the resource and the lock's label, never its token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from .contrib import otel, prometheus
from .engine import Lock, LockLost, LockNotAcquired, NodeFailure
from .signals import lock_contended, lock_lost, masters_failed, send_acquired, send_released

logger = logging.getLogger("django_redlock")


def _name(lock: Lock) -> str:
    return f"{lock.resource!r}" + (f" ({lock.label})" if lock.label else "")


def _template(lock: Lock) -> str:
    """The lock's template (the Django layer's locks carry one, checked: a str), for bounded
    metric labels."""
    return getattr(lock, "_layer", _UNLAYERED).template


class _Unlayered:
    """An engine lock's options of the Django layer: none."""

    template = prometheus.UNTEMPLATED


_UNLAYERED = _Unlayered()


class DjangoObserver:
    def acquired(self, lock: Lock, *, waited: float, attempts: int) -> None:
        if logger.isEnabledFor(logging.DEBUG):  # (naming the lock costs, even unlogged)
            logger.debug("acquired %s after %.3fs (%d attempts)", _name(lock), waited, attempts)
        prometheus.acquired(waited, _template(lock))
        otel.acquired(waited, attempts)
        send_acquired(lock, waited, attempts)

    def not_acquired(self, lock: Lock, *, waited: float, error: LockNotAcquired) -> None:
        logger.info("not acquired %s after %.3fs: %s", _name(lock), waited, error)
        prometheus.not_acquired(waited, error, _template(lock))
        otel.not_acquired(waited, error)
        lock_contended.send_robust(Lock, lock=lock, waited=waited, error=error)

    def released(self, lock: Lock, *, held: float) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("released %s after %.3fs", _name(lock), held)
        prometheus.released(held, _template(lock))
        send_released(lock, held)

    def lost(self, lock: Lock, *, error: LockLost) -> None:
        logger.error("LOST %s: %s", _name(lock), error)
        prometheus.lost()
        otel.lost(error.failures)
        lock_lost.send_robust(Lock, lock=lock, error=error)

    def masters_failed(self, lock: Lock, *, action: str, failures: Sequence[NodeFailure]) -> None:
        # The lock still works, but one more failure there may cost the quorum: warn, at most
        # once a minute per master, so that a master down for an hour is not a log flood.
        otel.masters_failed(failures)
        now = time.monotonic()
        for failure in failures:
            prometheus.node_failure(failure)
            if now >= _warned.get(failure.node, 0.0):
                _warned[failure.node] = now + WARN_EVERY
                logger.warning(
                    "master %s failed during %s of %s (the lock still has its quorum): %s %s",
                    failure.node,
                    action,
                    _name(lock),
                    failure.reason,
                    failure.detail,
                )
        masters_failed.send_robust(Lock, lock=lock, action=action, failures=tuple(failures))


#: A master's failures are logged at most this often (seconds); the signal and the metric see
#: every one.
WARN_EVERY = 60.0
_warned: dict[str, float] = {}
