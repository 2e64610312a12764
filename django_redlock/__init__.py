"""django-redlock: safe mutual exclusion across processes and machines (Redlock over N masters).

from django_redlock import redlock

with redlock("invoice:42", ttl=10, wait=5) as lock:
    ...
"""

from __future__ import annotations

from collections.abc import Callable

from .engine import Lock, LockContended, LockLost, LockNotAcquired, QuorumUnavailable, protocol

__all__ = ["LockContended", "LockLost", "LockNotAcquired", "QuorumUnavailable", "redlock"]


def redlock(
    resource: str,
    *,
    ttl: float | None = None,
    wait: float | None = None,
    label: str | None = None,
    auto_extend: bool = False,
    max_extensions: int | None = None,
    max_hold: float | None = None,
    reentrant: bool = False,
    on_lost: Callable[[Lock, LockLost], None] | None = None,
) -> Lock:
    """A lock on ``resource`` over the masters of ``settings.REDLOCK``.

    Use it as ``with redlock(...) as lock:`` or ``async with``. ``ttl`` (seconds) is the lease and
    ``wait`` (seconds) how long to keep trying when another owner holds it; both default to the
    setting. Leaving the block releases the lock on every master. Raises ``LockContended`` or
    ``QuorumUnavailable`` (both ``LockNotAcquired``) when it cannot be acquired, and ``LockLost``
    on leaving a block that outlived its lease.

    ``auto_extend=True`` renews the lease in the background until the block ends (capped by
    ``max_extensions`` / ``max_hold``); ``reentrant=True`` lets the owning thread or task enter
    it again; ``on_lost(lock, error)`` is called when the lease is lost while held. ``lock.fence``
    is a fencing token that strictly increases per resource.
    """
    from .conf import get_redlock

    return get_redlock().lock(
        resource,
        ttl=ttl,
        wait=wait,
        label=protocol.check_label(label),  # the engine checks it too, once the lead wires it
        auto_extend=auto_extend,
        max_extensions=max_extensions,
        max_hold=max_hold,
        reentrant=reentrant,
        on_lost=on_lost,
    )
