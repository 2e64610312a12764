"""Issue 10, waiting in one process: waiters that sleep instead of polling the masters, hand-off
in arrival order, and a lease that expires unreleased passing to a waiter at once.
Black box: the public API, and the masters read with plain redis clients.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections import Counter

import pytest

from django_redlock.testing.masters import LocalMaster
from tests.callers import STEP_TIMEOUT, aoutcome, outcome

pytestmark = pytest.mark.timeout(60)  # many threads and tasks: a hang must fail, not stall


def attempts_on(master: LocalMaster) -> int:
    """Commands a lock attempt or a poll would use, ever run on ``master``."""
    with master.client() as client:
        stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("set", "evalsha", "eval"))


# --- 6. waiters sleep ---------------------------------------------------------------------------


@pytest.mark.slow
def test_200_waiting_tasks_leave_the_masters_alone_then_all_acquire_in_turn(masters, redlock_of):
    holder = redlock_of(masters).lock("busy", ttl=10)
    engine = redlock_of(masters)

    async def take() -> None:
        async with engine.lock("busy", ttl=10, wait=10):
            pass

    async def main() -> tuple[int, Counter[str]]:
        await holder.aacquire()
        waiters = [asyncio.create_task(aoutcome(take())) for _ in range(200)]
        await asyncio.sleep(0.75)  # all have tried once by now, and wait
        before = attempts_on(masters[0])
        await asyncio.sleep(1.0)
        attempts = attempts_on(masters[0]) - before
        await holder.arelease()
        return attempts, Counter(await asyncio.gather(*waiters))

    attempts, outcomes = asyncio.run(main())
    assert attempts <= 10, f"SET/EVALSHA/EVAL on one master in 1 s of waiting; then: {outcomes}"
    assert outcomes == {"ok": 200}


# --- 7. FIFO hand-off within a process -------------------------------------------------------

#: Waiters that arrive one after another, 10 ms apart, and each hold the lock this long (which
#: gives a waiter that polls, rather than waits its turn, the time to barge in).
QUEUED = 30
HOLD = 0.01


def test_waiting_tasks_take_a_released_lock_in_arrival_order(masters, redlock_of):
    holder = redlock_of(masters).lock("fifo", ttl=10)
    engine = redlock_of(masters)
    arrived: list[int] = []
    acquired: list[int] = []

    async def take(i: int) -> None:
        lock = engine.lock("fifo", ttl=10, wait=15)
        arrived.append(i)
        async with lock:
            acquired.append(i)
            await asyncio.sleep(HOLD)

    async def main() -> Counter[str]:
        await holder.aacquire()
        waiters = []
        for i in range(QUEUED):
            waiters.append(asyncio.create_task(aoutcome(take(i))))
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)
        await holder.arelease()
        return Counter(await asyncio.gather(*waiters))

    assert asyncio.run(main()) == {"ok": QUEUED}
    assert acquired == arrived


def test_waiting_threads_take_a_released_lock_in_arrival_order(masters, redlock_of):
    holder = redlock_of(masters).lock("fifo", ttl=10).acquire()
    engine = redlock_of(masters)
    arrived: list[int] = []
    acquired: list[int] = []

    def take(i: int) -> None:
        lock = engine.lock("fifo", ttl=10, wait=15)
        arrived.append(i)
        with lock:
            acquired.append(i)
            time.sleep(HOLD)

    with concurrent.futures.ThreadPoolExecutor(QUEUED) as pool:
        waiters = []
        for i in range(QUEUED):
            waiters.append(pool.submit(outcome, functools.partial(take, i)))
            time.sleep(0.01)
        time.sleep(0.3)
        holder.release()
        assert Counter(w.result(STEP_TIMEOUT) for w in waiters) == {"ok": QUEUED}
    assert acquired == arrived


# --- 8. expiry hand-off -------------------------------------------------------------------------


def test_a_lease_that_expires_unreleased_passes_to_a_waiter_within_a_quarter_second(
    masters, redlock_of
):
    held = redlock_of(masters).lock("expiring", ttl=1.0).acquire()  # never released
    pttls = [m.call("PTTL", held.key) for m in masters]
    expired = time.monotonic() + max(pttls) / 1000  # gone from every master by then
    # Polling every ~3 s would take the lock up to 3 s late: only sleeping until the PTTL won't.
    waiter = redlock_of(masters, retry_delay=3.0).lock("expiring", ttl=5, wait=5)
    waiter.acquire()
    late = time.monotonic() - expired
    waiter.release()
    assert late <= 0.25, f"acquired {late:.3f} s after the lease expired on the masters"
    assert not held.held
