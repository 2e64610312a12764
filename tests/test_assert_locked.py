"""``assert_locked(resource)``: raises unless the calling thread or task holds that lock now.
A local check of the engine's holders: it makes no request to the masters."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_redlock.engine import LockLost, NotLocked
from tests.conftest import wait_until


def test_only_the_holding_thread_passes(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    with pytest.raises(NotLocked, match="'job' is not held by thread"):
        engine.assert_locked("job")
    with engine.lock("job", ttl=5):
        engine.assert_locked("job")
        seen: list[BaseException] = []

        def other() -> None:
            try:
                engine.assert_locked("job")
            except NotLocked as error:
                seen.append(error)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(seen) == 1  # held, but by another thread
    with pytest.raises(NotLocked):
        engine.assert_locked("job")  # released


def test_a_lock_over_several_resources_asserts_each(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    with engine.lock("a", "b", ttl=5):
        engine.assert_locked("a")
        engine.assert_locked("b")
        with pytest.raises(NotLocked):
            engine.assert_locked("c")


def test_a_lease_that_ran_out_raises_lock_lost(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    lock = engine.lock("job", ttl=1.0)
    lock.acquire()
    assert wait_until(lambda: all(m.call("EXISTS", lock.key) == 0 for m in masters), 10)  # ran out
    with pytest.raises(LockLost):
        engine.assert_locked("job")
    with pytest.raises(LockLost):
        lock.release()


def test_a_finished_at_least_lock_is_not_held_by_anyone(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    with engine.lock("job", ttl=5, at_least=5):
        engine.assert_locked("job")
    with pytest.raises(NotLocked):
        engine.assert_locked("job")


def test_tasks_are_owners_too(masters, redlock_of) -> None:
    engine = redlock_of(masters)

    async def main() -> None:
        async with engine.lock("job", ttl=5):
            engine.assert_locked("job")
            child = asyncio.create_task(asyncio.sleep(0))
            await child

            async def unguarded() -> None:
                engine.assert_locked("job")

            with pytest.raises(NotLocked):
                await asyncio.create_task(unguarded())

    asyncio.run(main())


def test_no_network_call(masters, redlock_of) -> None:
    """Every master paused: the check still answers at once (a request would wait out the 2 s
    budget of each master; the bound leaves a loaded machine 1 s)."""
    engine = redlock_of(masters, node_timeout=2.0)
    with engine.lock("job", ttl=5):
        for m in masters:
            m.pause()
        try:
            began = time.monotonic()
            engine.assert_locked("job")
            assert time.monotonic() - began < 1.0
        finally:
            for m in masters:
                m.resume()


def test_the_django_helper(redlock_settings) -> None:
    from django_redlock import assert_locked, redlock

    with pytest.raises(NotLocked):
        assert_locked("job")
    with redlock("job"):
        assert_locked("job")
    with pytest.raises(ValueError, match="resource"):
        assert_locked("")


@pytest.mark.parametrize("mode", [{"limit": 3}, {"shared": True}], ids=["permit", "reader"])
def test_a_permit_or_a_reader_of_the_resource_holds_it(masters, redlock_of, mode) -> None:
    """Inside a semaphore's permit or a reader of ``name``, the caller holds ``name`` (in that
    mode): its lease is under a key of its own (a slot, a reader's), found all the same."""
    engine = redlock_of(masters)
    with engine.lock("pool", ttl=5, **mode):
        engine.assert_locked("pool")
        seen: list[BaseException] = []
        thread = threading.Thread(target=lambda: _refused(engine, "pool", seen))
        thread.start()
        thread.join()
        assert len(seen) == 1  # another thread does not hold it
        with pytest.raises(NotLocked):
            engine.assert_locked("other")
    with pytest.raises(NotLocked):
        engine.assert_locked("pool")  # released


def _refused(engine, resource: str, seen: list[BaseException]) -> None:
    try:
        engine.assert_locked(resource)
    except NotLocked as error:
        seen.append(error)
