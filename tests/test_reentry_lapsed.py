"""An owner whose re-entrant lease ran out gets ``LockLost`` when it enters again through another
handle, whatever other threads or tasks of the process took and let go of meanwhile: this
process's table of leases keeps every unreleased lease under a key, not only the last one."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_redlock.engine import LockLost
from tests.conftest import wait_until


def test_a_lapsed_owner_reentering_is_told_lost_after_another_thread_held_it(masters, redlock_of):
    engine = redlock_of(masters)
    outer = engine.lock("lapsed", ttl=1, reentrant=True)
    outer.acquire()
    assert wait_until(lambda: outer.validity == 0, 10), "the lease never ran out"

    def another_thread_takes_and_releases() -> None:
        with engine.lock("lapsed", ttl=5, wait=10):
            pass

    other = threading.Thread(target=another_thread_takes_and_releases)
    other.start()
    other.join(30)
    assert not other.is_alive()
    inner = engine.lock("lapsed", ttl=5, reentrant=True)
    with pytest.raises(LockLost):
        inner.acquire()
    assert inner.hold_count == 0  # no fresh lease taken behind the owner's back
    with pytest.raises(LockLost):
        outer.release()


def test_the_same_between_tasks(masters, redlock_of):
    engine = redlock_of(masters)

    async def main() -> None:
        outer = engine.lock("lapsed-task", ttl=1, reentrant=True)
        await outer.aacquire()
        assert await asyncio.to_thread(
            wait_until, lambda: outer._callers.get(owner).validity == 0, 10
        )

        async def another_task() -> None:
            async with engine.lock("lapsed-task", ttl=5, wait=10):
                pass

        await asyncio.create_task(another_task())
        inner = engine.lock("lapsed-task", ttl=5, reentrant=True)
        with pytest.raises(LockLost):
            await inner.aacquire()
        assert inner.hold_count == 0
        with pytest.raises(LockLost):
            await outer.arelease()

    owner: object = None

    async def run() -> None:
        nonlocal owner
        owner = asyncio.current_task()
        await main()

    asyncio.run(run())


def test_the_other_holder_is_still_found_by_its_own_owner(masters, redlock_of):
    """Two unreleased leases under one key (a lapsed one, and the next holder's): each owner
    finds its own; the lapsed one's release leaves the live one listed."""
    engine = redlock_of(masters)
    lapsed = engine.lock("both", ttl=1, reentrant=True)
    lapsed.acquire()
    assert wait_until(lambda: lapsed.validity == 0, 10)
    entered: list[int] = []
    holding, done = threading.Event(), threading.Event()

    def next_holder() -> None:
        with engine.lock("both", ttl=10, wait=10, reentrant=True):
            holding.set()
            done.wait(30)
            with engine.lock("both", ttl=10, reentrant=True) as again:
                entered.append(again.hold_count)

    thread = threading.Thread(target=next_holder)
    thread.start()
    assert holding.wait(30)
    with pytest.raises(LockLost):
        lapsed.release()
    done.set()
    thread.join(30)
    assert entered == [2]
