"""The watchdog's expiry notices (``on_lost`` and the ``lost`` event of a lease that runs out
unreleased) start in a plain list and reach the heap when the first of them falls due
(``Watchdog.watch_expiry``): whatever else is in that list, each lease is still told at its own
expiry, once, and a released or extended one is not told at its old deadline.

The leases are 1-2 s, not shorter: each must be acquired or extended well within its TTL on a
loaded machine, and each "not told yet" is looked at a second before the deadline concerned."""

from __future__ import annotations

import contextlib
import time

from django_redlock import LockLost
from django_redlock.engine.running.watchdog import SWEEP_AT

from .conftest import wait_until


class Told:
    """When each lock's ``on_lost`` was called, by resource."""

    def __init__(self) -> None:
        self.at: dict[str, list[float]] = {}

    def __call__(self, lock, error) -> None:  # type: ignore[no-untyped-def]
        self.at.setdefault(lock.resource, []).append(time.monotonic())


def _expiry(lock) -> float:  # type: ignore[no-untyped-def]
    return time.monotonic() + lock.validity


def test_a_short_lease_after_a_long_one_is_told_at_its_own_expiry(masters, redlock_of):
    """The watchdog sleeps until the long lease's deadline: the short one must wake it."""
    told, engine = Told(), redlock_of(masters)
    long = engine.lock("long", ttl=30, on_lost=told).acquire()
    short = engine.lock("short", ttl=1.0, on_lost=told).acquire()
    expires = _expiry(short)
    assert wait_until(lambda: "short" in told.at, 5)
    assert 0 <= told.at["short"][0] - expires < 0.3
    assert "long" not in told.at
    long.release()
    with contextlib.suppress(LockLost):  # (told; the keys may not have run out yet)
        short.release()
    assert len(told.at["short"]) == 1


def test_a_lease_still_held_when_another_falls_due_is_told_at_its_own_expiry(masters, redlock_of):
    """The first lease falling due moves the list to the heap: the later one is told at its own
    deadline, not at the first one's, and a released one never."""
    told, engine = Told(), redlock_of(masters)
    with engine.lock("first", ttl=1.0, on_lost=told) as first:
        first_expires = _expiry(first)
        # released: nothing to tell when its deadline comes
    later = engine.lock("later", ttl=2.0, on_lost=told).acquire()
    expires = _expiry(later)
    # Past the first one's deadline: the list moved to the heap.
    time.sleep(max(0.0, first_expires + 0.05 - time.monotonic()))
    assert told.at == {}
    assert wait_until(lambda: "later" in told.at, 5)
    assert 0 <= told.at["later"][0] - expires < 0.3
    assert "first" not in told.at
    with contextlib.suppress(LockLost):  # (told; the keys may not have run out yet)
        later.release()


def test_a_lease_extended_while_in_the_list_is_told_at_its_new_expiry(masters, redlock_of):
    told, engine = Told(), redlock_of(masters)
    lock = engine.lock("extended", ttl=1.0, on_lost=told).acquire()
    first_expires = _expiry(lock)
    lock.extend(ttl=2.0)
    expires = _expiry(lock)
    time.sleep(max(0.0, first_expires + 0.05 - time.monotonic()))  # past the first deadline
    assert told.at == {}  # not told then
    assert wait_until(lambda: "extended" in told.at, 5)
    assert 0 <= told.at["extended"][0] - expires < 0.3
    with contextlib.suppress(LockLost):  # (told; the keys may not have run out yet)
        lock.release()


def test_a_lease_held_through_a_sweep_of_the_list_is_still_told(masters, redlock_of):
    """A thousand released leases make the list sweep itself (and ``test_semantics`` that it
    stays small): the one still held stays in it."""
    told, engine = Told(), redlock_of(masters)
    held = engine.lock("held", ttl=30, on_lost=told).acquire()
    for _ in range(SWEEP_AT + 10):
        with engine.lock("busy", ttl=30, on_lost=told):
            pass
    held.extend(ttl=1.0)  # (its live look is now the extend's: the list's entry is dropped)
    expires = _expiry(held)
    assert wait_until(lambda: "held" in told.at, 5)
    assert 0 <= told.at["held"][0] - expires < 0.3
    assert "busy" not in told.at
    with contextlib.suppress(LockLost):  # (told; the keys may not have run out yet)
        held.release()
