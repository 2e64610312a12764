"""django-redlock: safe mutual exclusion across processes and machines (Redlock over N masters).

from django_redlock import redlock

with redlock("invoice:42", ttl=10, wait=5) as lock:
    ...
"""

from __future__ import annotations

from .engine import Lock, LockContended, LockLost, LockNotAcquired, QuorumUnavailable

__all__ = ["LockContended", "LockLost", "LockNotAcquired", "QuorumUnavailable", "redlock"]


def redlock(
    resource: str,
    *,
    ttl: float | None = None,
    wait: float | None = None,
    label: str | None = None,
) -> Lock:
    """A lock on ``resource`` over the masters of ``settings.REDLOCK``.

    Use it as ``with redlock(...) as lock:`` or ``async with``. ``ttl`` (seconds) is the lease and
    ``wait`` (seconds) how long to keep trying when another owner holds it; both default to the
    setting. Leaving the block releases the lock on every master. Raises ``LockContended`` or
    ``QuorumUnavailable`` (both ``LockNotAcquired``) when it cannot be acquired, and ``LockLost``
    on leaving a block that outlived its lease.
    """
    from .conf import get_redlock

    return get_redlock().lock(resource, ttl=ttl, wait=wait, label=label)
