"""What a lock tells the outside world, without the engine knowing who listens.

The Django layer plugs in an observer that sends signals, logs and counts metrics; the engine only
calls these methods. An observer must not raise: what it raises is logged and ignored, because a
failing metrics exporter must never break a lock.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .errors import LockLost, LockNotAcquired, NodeFailure

logger = logging.getLogger("django_redlock")


class Subject(Protocol):
    """What an event says of the lock it is about, here (a ``kinds.lock.Lock``): its name."""

    @property
    def resource(self) -> str: ...


#: The lock an observer is told about: a ``Redlock``'s observer is an ``Observer[Lock]``, named
#: there (this layer is below the handle).
L_contra = TypeVar("L_contra", bound=Subject, contravariant=True)
L = TypeVar("L", bound=Subject)


class Observer(Protocol[L_contra]):
    def acquired(self, lock: L_contra, *, waited: float, attempts: int) -> None: ...

    def not_acquired(self, lock: L_contra, *, waited: float, error: LockNotAcquired) -> None: ...

    def released(self, lock: L_contra, *, held: float) -> None: ...

    def lost(self, lock: L_contra, *, error: LockLost) -> None: ...

    def masters_failed(
        self, lock: L_contra, *, action: str, failures: Sequence[NodeFailure]
    ) -> None: ...


class NullObserver:
    """The default: nobody listens. (``lock: Any``: a subclass's methods may name the lock as
    ``Lock``, as every observer's do.)"""

    def acquired(self, lock: Any, *, waited: float, attempts: int) -> None:
        pass

    def not_acquired(self, lock: Any, *, waited: float, error: LockNotAcquired) -> None:
        pass

    def released(self, lock: Any, *, held: float) -> None:
        pass

    def lost(self, lock: Any, *, error: LockLost) -> None:
        pass

    def masters_failed(self, lock: Any, *, action: str, failures: Sequence[NodeFailure]) -> None:
        pass


def notify(observer: Observer[L], event: str, lock: L, **details: object) -> None:
    """Call ``observer.<event>(lock, **details)``; log, never raise, what it raises. An observer
    written before an event existed (``masters_failed``) simply does not hear it."""
    method = getattr(observer, event, None)
    if method is None:
        return
    try:
        method(lock, **details)
    except Exception:  # noqa: BLE001 (an observer's bug must not break the lock)
        logger.exception("django_redlock observer failed on %s for %r", event, lock.resource)


# The two events of every cycle, with their keywords written out (not ``notify``'s
# ``**details``): saves 5.5k instructions a cycle, 1.3%; kept for issue 37's budget. Same rule:
# an observer without the method does not hear it, and what it raises is logged.


def notify_acquired(observer: Observer[L], lock: L, waited: float, attempts: int) -> None:
    """``notify(observer, "acquired", lock, waited=waited, attempts=attempts)``."""
    method = getattr(observer, "acquired", None)
    if method is None:
        return
    try:
        method(lock, waited=waited, attempts=attempts)
    except Exception:  # noqa: BLE001 (an observer's bug must not break the lock)
        logger.exception("django_redlock observer failed on %s for %r", "acquired", lock.resource)


def notify_released(observer: Observer[L], lock: L, held: float) -> None:
    """``notify(observer, "released", lock, held=held)``."""
    method = getattr(observer, "released", None)
    if method is None:
        return
    try:
        method(lock, held=held)
    except Exception:  # noqa: BLE001 (an observer's bug must not break the lock)
        logger.exception("django_redlock observer failed on %s for %r", "released", lock.resource)
