"""The Redlock engine: Django-free, usable and testable without settings."""

from .connections import NodeSpec
from .errors import (
    ExtensionLimit,
    LockContended,
    LockLost,
    LockNotAcquired,
    NodeFailure,
    NotLocked,
    Overloaded,
    QuorumUnavailable,
    RedlockError,
)
from .lock import Lock
from .redlock import Redlock

__all__ = [
    "ExtensionLimit",
    "Lock",
    "LockContended",
    "LockLost",
    "LockNotAcquired",
    "NodeFailure",
    "NodeSpec",
    "NotLocked",
    "Overloaded",
    "QuorumUnavailable",
    "Redlock",
    "RedlockError",
]
