"""Re-entry: the leases held in this process, by key, and which one a new acquisition by the same
owner enters again.

An owner re-enters (with ``reentrant=True``) a lease that covers every resource it asks for: the
same ones, in any order, or fewer (``transfer()`` holding both accounts calls a helper that locks
one), through the same handle or another. Holding only some of them, or all of them under
different leases, it can neither re-enter (one handle speaks of one lease) nor acquire (it would
wait for itself): that is refused at once, with the reason.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Protocol

from ..base import process
from ..base.errors import LockContended
from .leases import Lease, Owner, describe


class Entering(Protocol):
    """What re-entry reads of the handle an owner acquires through (a ``kinds.lock.Lock``)."""

    @property
    def resource(self) -> str: ...
    @property
    def resources(self) -> tuple[str, ...]: ...
    @property
    def keys(self) -> tuple[str, ...]: ...
    @property
    def reentrant(self) -> bool: ...


#: Guards the tables' writes (a lease added, removed, the dead swept): a sweep must not delete a
#: key that another thread has just given to a new lease. Reads take no lock. One for all
#: tables, held for a few bytecodes, never across I/O.
_TABLES = threading.Lock()

#: A table is swept of dead references once it holds this many keys, then whenever it has
#: doubled since (as the watchdog's schedule is).
SWEEP_AT = 1024


def _after_fork_in_child() -> None:
    global _TABLES
    _TABLES = threading.Lock()  # a parent thread may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


class Holders:
    """The live leases of this process, under each of their keys. Weak: a dropped handle does not
    leave a phantom holder behind.

    Each key maps to the lease's plain weak reference, ``weakref.ref(lease)``: Python keeps one
    per object and hands it out again, so the watchdog's look at the same lease shares it (a
    ``WeakValueDictionary`` made a keyed reference of its own per lease: 88 more bytes per held
    lock). A lease dropped unreleased leaves its dead reference behind until the next sweep.

    Seldom, one key has several unreleased leases: an owner's lease ran out (unreleased: its
    owner has not been told yet) and another owner took the lock since. Then the key maps to a
    tuple of their references, oldest first, so that what one owner finds under it never
    depends on what other owners took and let go of meanwhile (the lapsed owner re-entering
    finds its own lease, lost, not nothing)."""

    __slots__ = ("_by_key", "_sweep_at")

    def __init__(self) -> None:
        self._by_key: dict[str, Held] = {}
        self._sweep_at = SWEEP_AT

    def __getitem__(self, key: str) -> Lease:
        """The latest unreleased lease under ``key``."""
        for ref in reversed(_refs(self._by_key[key])):
            lease = ref()
            if lease is not None and not lease.released:
                return lease
        raise KeyError(key)

    def add(self, lease: Lease) -> weakref.ref[Lease]:
        """List ``lease`` under its keys; its weak reference (the watchdog's too)."""
        ref = weakref.ref(lease)
        by_key = self._by_key
        # (Here and in ``remove``: acquire and release, not ``with``: saves 2.2k instructions a
        # cycle, 0.5%; kept for issue 37's budget.)
        tables = _TABLES
        tables.acquire()
        try:
            for key in lease.keys:
                held = by_key.get(key)
                if held is None:  # (the usual case)
                    by_key[key] = ref
                else:
                    others = _live(held)
                    by_key[key] = (*others, ref) if others else ref
            if len(by_key) >= self._sweep_at:
                self._by_key = {k: r for k, r in by_key.items() if _live(r)}
                self._sweep_at = max(SWEEP_AT, 2 * len(self._by_key))
        finally:
            tables.release()
        return ref

    def remove(self, lease: Lease) -> None:
        by_key = self._by_key
        tables = _TABLES
        tables.acquire()
        try:
            for key in lease.keys:
                held = by_key.get(key)
                if held is None:
                    continue
                if not isinstance(held, tuple):  # (the usual case)
                    if held() is lease:
                        del by_key[key]
                    continue
                others = tuple(r for r in _live(held) if r() is not lease)
                if not others:
                    del by_key[key]
                else:
                    by_key[key] = others[0] if len(others) == 1 else others
        finally:
            tables.release()

    def of(self, owner: Owner, keys: tuple[str, ...]) -> list[Lease | None] | None:
        """Per key, the lease under which ``owner``, in this process, holds it (or None); None
        if no lease is listed under any of them (every acquisition that is not a re-entry: one
        look in C, not a list of Nones made and counted)."""
        if self._by_key.keys().isdisjoint(keys):
            return None
        pid = process.pid
        leases: list[Lease | None] = []
        for key in keys:
            held = self._by_key.get(key)
            found = None
            # Its own (not another's, nor our parent's if we are a forked child), latest first.
            for ref in () if held is None else reversed(_refs(held)):
                lease = ref()
                if lease is not None and lease.owner is owner and lease.pid == pid:
                    if not lease.released:
                        found = lease
                        break
            leases.append(found)
        return leases

    def under(self, owner: Owner, resource: str) -> Lease | None:
        """The live lease under which ``owner``, in this process, holds ``resource`` in a mode
        whose keys are not the resource's own (a permit's slot, a reader's key): looked for among
        all leases (``assert_locked``'s second look; a plain lock is found by ``of``)."""
        pid = process.pid
        for ref in [r for held in list(self._by_key.values()) for r in _refs(held)]:
            lease = ref()
            if (
                lease is not None
                and lease.owner is owner
                and lease.pid == pid
                and not lease.released
                and resource in lease.resources
            ):
                return lease
        return None


Held = weakref.ref[Lease] | tuple[weakref.ref[Lease], ...]


def _refs(held: Held) -> tuple[weakref.ref[Lease], ...]:
    return held if isinstance(held, tuple) else (held,)


def _live(held: Held) -> tuple[weakref.ref[Lease], ...]:
    """The references of ``held`` whose lease lives and is not released."""
    return tuple(r for r in _refs(held) if (lease := r()) is not None and not lease.released)


def reentered(lock: Entering, owner: Owner, mine: Lease | None, holders: Holders) -> Lease | None:
    """The lease ``owner`` re-entered (one level deeper) to take ``lock``: ``mine`` (its lease
    through that very handle) or one it holds every resource of ``lock`` under; None if it holds
    none of them (or what it held ran out): acquire for real. ``LockContended`` at once if it
    holds any of them and may not re-enter: waiting would be waiting for itself."""
    if mine is not None and not lock.reentrant:
        raise RuntimeError(
            f"lock {lock.resource!r} is already acquired through this object by "
            f"{describe(owner)}; use one Lock object per acquisition, or reentrant=True"
        )
    if mine is None:
        leases = holders.of(owner, lock.keys)
        if leases is None:
            return None  # none of its keys is held in this process: acquire for real
        outer = covering(lock, leases)
        if outer is None:
            return None
    else:
        outer = mine
    if outer.check_lost() and not lock.reentrant:
        return None  # its lease ran out: we do not hold it any more, so acquire for real
    if not lock.reentrant:
        raise LockContended(
            lock.resource,
            f"lock {lock.resource!r} is already held by this same thread/task: acquiring it "
            f"again would wait for ourselves; pass reentrant=True to re-enter it",
        )
    if outer.check_lost():
        raise outer.lost_error()
    outer.depth += 1
    return outer


def covering(lock: Entering, leases: list[Lease | None]) -> Lease | None:
    """The one lease among ``leases`` (the owner's, per key of ``lock``) that covers them all;
    None if there is none that still lives; ``LockContended`` if it holds only some of them."""
    first = leases[0]
    if first is not None and all(lease is first for lease in leases):
        return first  # one lease covers them all (exactly these resources, or more)
    if leases.count(None) == len(leases):
        return None  # it holds none of them (every acquisition that is not a re-entry)
    live = {lease for lease in leases if lease is not None and not lease.check_lost()}
    if not live:
        return None
    have = [r for r, lease in zip(lock.resources, leases, strict=True) if lease in live]
    through = " and ".join(sorted(repr(lease.resource) for lease in live))
    if len(have) < len(lock.resources):
        lacking = [r for r in lock.resources if r not in have]
        why = f"it holds {_names(have)} (through lock {through}) but not {_names(lacking)}"
    else:
        why = f"it holds {_names(have)} through different locks ({through})"
    raise LockContended(
        lock.resource,
        f"lock {lock.resource!r} cannot be acquired by this same thread/task: {why}; acquiring "
        f"would wait for ourselves, and re-entry needs one held lock that covers every resource "
        f"asked for: take them together in the outer lock",
    )


def _names(resources: list[str]) -> str:
    return " and ".join(repr(r) for r in resources)
