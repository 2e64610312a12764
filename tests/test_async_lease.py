"""The async twin of the lease: same procedures, same errors, cancellation-safe release."""

from __future__ import annotations

import asyncio
import time

import pytest

from django_redlock import LockContended, LockLost
from django_redlock.testing.masters import LocalMaster

from .conftest import until_set


def keys_left(masters: list[LocalMaster], key: str) -> int:
    return sum(m.call("EXISTS", key) for m in masters)


def test_async_auto_extend_fence_and_lost(masters, redlock_of):
    engine = redlock_of(masters)

    async def main() -> None:
        async with engine.lock("a", ttl=0.3, auto_extend=True) as lock:
            await asyncio.sleep(0.8)
            assert not lock.lost
            first = await lock.afence()
        async with engine.lock("a", ttl=2) as lock:
            assert await lock.afence() > first
        with pytest.raises(LockLost):
            async with engine.lock("a", ttl=0.2):
                await asyncio.sleep(0.4)

    asyncio.run(main())
    assert keys_left(masters, "redlock:lock:a") == 0


def test_async_waiter_is_woken_by_a_release_notice(masters, redlock_of):
    engine = redlock_of(masters, retry_delay=3.0)

    async def main() -> float:
        holder = await engine.lock("h", ttl=5).aacquire()

        async def waiter() -> float:
            async with engine.lock("h", ttl=5, wait=10):
                return time.monotonic()

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.3)
        released = time.monotonic()
        await holder.arelease()
        return await task - released

    assert asyncio.run(main()) < 0.5


def test_a_task_cancelled_while_waiting_leaves_nothing_behind(masters, redlock_of):
    engine = redlock_of(masters)

    async def main() -> None:
        holder = await engine.lock("c", ttl=5).aacquire()

        async def waiter() -> None:  # its own task owns what it acquires
            await engine.lock("c", ttl=5, wait=10).aacquire()

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # It left the waiter queues: a release must not wake a waiter that is gone.
        assert keys_left(masters, engine.queue_key("c")) == 0
        # The holder is untouched and the engine still works on the same loop.
        assert holder.validity > 0
        await holder.arelease()
        async with engine.lock("c", ttl=5):
            pass

    asyncio.run(main())
    assert keys_left(masters, "redlock:lock:c") == 0


def test_a_task_cancelled_inside_the_block_still_releases(masters, redlock_of):
    engine = redlock_of(masters)

    async def main() -> None:
        entered = asyncio.Event()

        async def worker() -> None:
            async with engine.lock("d", ttl=30, wait=5):
                entered.set()
                await asyncio.sleep(10)

        task = asyncio.create_task(worker())
        await until_set(entered, task)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    # Released at once on all masters, not left until its 30 s TTL.
    assert keys_left(masters, "redlock:lock:d") == 0


def test_async_reentry_is_per_task(masters, redlock_of):
    engine = redlock_of(masters)

    async def main() -> None:
        async with engine.lock("e", ttl=5, reentrant=True):
            async with engine.lock("e", ttl=5, reentrant=True):
                pass

            async def other_task() -> None:
                await engine.lock("e", ttl=5, reentrant=True).aacquire()

            with pytest.raises(LockContended):
                await asyncio.create_task(other_task())

    asyncio.run(main())


def test_a_task_cancelled_mid_round_undoes_the_sets_that_landed(fresh_masters, redlock_of):
    masters = fresh_masters(5)
    engine = redlock_of(masters, node_timeout=1.0)
    for m in masters[2:]:
        m.pause()  # the round waits on these three, while the other two have said OK

    async def main() -> None:
        task = asyncio.create_task(engine.lock("mid", ttl=30).aacquire())
        await asyncio.sleep(0.2)
        assert keys_left(masters[:2], "redlock:lock:mid") == 2  # landed, round still open
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
        # Undone before the cancellation went through, not left for their 30 s TTL.
        assert keys_left(masters[:2], "redlock:lock:mid") == 0
    finally:
        for m in masters[2:]:
            m.resume()
