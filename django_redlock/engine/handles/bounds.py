"""What an inner re-entry's ``at_least`` and ``at_most`` do to the lease it re-enters: the
strictest of all entries holds (the longest ``at_least``, the shortest ``at_most``), each
counted from the entry that asked for it.

Why not the outer entry's alone: ``manage.py redlock_run -- nightly`` takes the lock with no
bounds, and the command's own guard (``lock_at_least = 6``) re-enters it. Kept by the outer
entry's bounds only, the lock was released when the command ended, and the same cron line on a
host whose clock is late ran it again; a ``lock_at_most`` that should free a hung run's slot
did nothing. An inner entry asks for a promise about the lock; the lock keeps it, or the entry
is refused (bounds that contradict each other: kept at least past the time it may be held at
most).

``at_least`` is kept on the lease (``Lease.at_least``, seconds after it was taken) and used by
the release of its last entry. ``at_most`` lowers the lease's cap (``max_hold``): renewals stop
there (the watchdog, ``lock.extend()``), and a lease that already reaches past it is cut now
(one round: ``tighten`` returns the TTL to renew it with).
"""

from __future__ import annotations

import time

from ..algorithm import holding
from ..algorithm.steps import Masters
from ..base import protocol
from ..leases.leases import Lease
from ..running.drivers import run


def enter(masters: Masters, lease: Lease, at_least: float | None, at_most: float | None) -> None:
    """An inner entry of ``lease`` (its depth already counted) with bounds of its own: the lease
    keeps the strictest (``tighten``), cut now (one round) if it reaches past a tighter
    ``at_most``. If that fails (``ValueError``, ``LockLost``...), the entry is not made. An
    async caller's loop waits for that rare round: re-entering is synchronous."""
    try:
        cut = tighten(lease, at_least, at_most, masters.drift_factor)
        if cut is not None:
            run(masters, holding.extend(masters, lease, once=False, ttl=cut))
    except BaseException:
        lease.depth -= 1
        raise


def tighten(
    lease: Lease, at_least: float | None, at_most: float | None, drift_factor: float
) -> float | None:
    """Take an inner entry's bounds into ``lease``; the TTL to renew it with now when it must be
    cut to end by the new cap, else None. ``ValueError`` (nothing changed) when they contradict
    the lease's: kept at least past the time it may be held at most."""
    held = time.monotonic() - lease.acquired_at
    acquiring = lease.handle()  # the outer entry's handle: its own at_least counts too
    least = kept(None if acquiring is None else acquiring.at_least, lease)
    if at_least is not None and (least is None or held + at_least > least):
        least = held + at_least
    most = lease.max_hold
    if at_most is not None and (most is None or held + at_most < most):
        most = held + at_most
    if least is not None and most is not None and least > most:
        raise ValueError(
            f"lock {lease.resource!r} re-entered with at_least={at_least!r}, at_most="
            f"{at_most!r}: the lock would be kept at least {least - held:g}s from now but held "
            f"at most {most - held:g}s from now"
        )
    if at_least is not None and least != lease.at_least:
        lease.at_least = least
    if most == lease.max_hold or most is None:
        return None
    lease.max_hold = most
    left = lease.acquired_at + most - time.monotonic()
    reach = lease.valid_until + protocol.drift(lease.ttl, drift_factor)  # its keys' end, at most
    if reach <= lease.acquired_at + most:
        return None  # it ends by the cap already: renewals will stop there
    return max(left, protocol.MIN_TTL)


def kept(at_least: float | None, lease: Lease) -> float | None:
    """The ``at_least`` a release of ``lease`` keeps it for: the releasing handle's, or an inner
    entry's if that is longer."""
    inner = lease.at_least
    if inner is None or (at_least is not None and at_least >= inner):
        return at_least
    return inner
