"""The Redlock engine: Django-free, usable and testable without settings.

Its layers are packages, each importing only from those below it (``tests/test_engine_layout.py``
holds them to that; ``docs/architecture.md`` draws them from the real imports)::

    base < scripts < members < waiting < leases < algorithm < running < handles < kinds < here

``here`` is ``redlock.py`` (``Redlock``: the masters and the settings every lock shares) and
``locking.py`` (the ``@locking`` decorator), and the public names below."""

from .base.errors import (
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
from .kinds.lock import Lock
from .members.connections import NodeSpec
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
