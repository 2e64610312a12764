"""The async twin of the lease: same procedures, same errors, cancellation-safe release."""

from __future__ import annotations

import asyncio
import time

import pytest

from django_redlock import LockContended, LockLost
from django_redlock.testing.masters import LocalMaster

from .conftest import await_until, until_set


def keys_left(masters: list[LocalMaster], key: str) -> int:
    return sum(m.call("EXISTS", key) for m in masters)


def test_async_auto_extend_fence_and_lost(masters, redlock_of):
    engine = redlock_of(masters)

    async def main() -> None:
        # 1 s: renewed every 1/3 s, a renewal may come 2/3 s late on a loaded machine.
        async with engine.lock("a", ttl=1.0, auto_extend=True) as lock:
            lease = engine.holders[lock.key]
            # Past one TTL (the fourth renewal is due 4/3 TTL after the grant), still held.
            assert await await_until(lambda: lease.extensions >= 4, 10), lease.extensions
            assert keys_left(masters, lock.key) == len(masters)
            assert not lock.lost
            first = await lock.afence()
        async with engine.lock("a", ttl=2) as lock:
            assert await lock.afence() > first
        with pytest.raises(LockLost):
            async with engine.lock("a", ttl=1.0) as lock:
                assert await await_until(lambda: keys_left(masters, lock.key) == 0, 10)  # ran out

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
        # Queued on every master: it tried, lost, and sleeps until a notice (or 3 s).
        queued = lambda: all(m.call("ZCARD", engine.queue_key("h")) == 1 for m in masters)  # noqa: E731
        assert await await_until(queued, 10)
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
        # Queued (what its cancellation must undo), then cancelled.
        assert await await_until(lambda: keys_left(masters, engine.queue_key("c")) == 5, 10)
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
    # A budget the test never waits out (it cancels first), long enough that a loaded machine
    # cannot end the round before the test has seen the two grants land.
    engine = redlock_of(masters, node_timeout=2.0)
    for m in masters[2:]:
        m.pause()  # the round waits on these three, while the other two have said OK

    async def main() -> None:
        task = asyncio.create_task(engine.lock("mid", ttl=30).aacquire())
        # Landed on the two that answer, the round still open.
        assert await await_until(lambda: keys_left(masters[:2], "redlock:lock:mid") == 2, 1.5)
        assert not task.done()
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
