"""The Redlock engine: Django-free, usable and testable without settings."""

from .client import Redlock
from .errors import (
    LockContended,
    LockLost,
    LockNotAcquired,
    NodeFailure,
    QuorumUnavailable,
    RedlockError,
)
from .lock import Lock
from .nodes import NodeSpec

__all__ = [
    "Lock",
    "LockContended",
    "LockLost",
    "LockNotAcquired",
    "NodeFailure",
    "NodeSpec",
    "QuorumUnavailable",
    "Redlock",
    "RedlockError",
]
