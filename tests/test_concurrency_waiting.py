"""Issue 10, waiting in one process: waiters that sleep instead of polling the masters, hand-off
in arrival order, and a lease that expires unreleased passing to a waiter at once.
Black box: the public API, and the masters read with plain redis clients.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
import time
from collections import Counter

import pytest

from django_redlock.engine import LockContended, Redlock
from django_redlock.engine.algorithm import procedures
from django_redlock.engine.algorithm.procedures import SAFETY_POLL
from django_redlock.testing.masters import LocalMaster
from tests.callers import STEP_TIMEOUT, aoutcome, outcome
from tests.conftest import await_until, wait_until

#: Which waiter the current thread or task is, for ``joins``.
WAITER: contextvars.ContextVar[int] = contextvars.ContextVar("WAITER")


def joins(engine: Redlock, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The waiters (``WAITER``) in the order they joined ``engine``'s local queue: where a
    process's waiters take their places, so the arrival order its FIFO keeps. (A waiter that
    noted its arrival before calling acquire could be overtaken between the two on a loaded
    machine.)"""
    joined: list[int] = []
    join = engine.queues.join

    def recording(resources: tuple[str, ...]) -> object:
        joined.append(WAITER.get(-1))
        return join(resources)

    monkeypatch.setattr(engine.queues, "join", recording)
    return joined


def queued(masters: list[LocalMaster], engine: Redlock, counts: dict[str, int]) -> bool:
    """Whether each resource's queue holds ``counts[resource]`` waiters on every master."""
    return all(
        m.call("ZCARD", engine.queue_key(resource)) == count
        for m in masters
        for resource, count in counts.items()
    )


pytestmark = pytest.mark.timeout(60)  # many threads and tasks: a hang must fail, not stall


def attempts_on(master: LocalMaster) -> int:
    """Commands a lock attempt or a poll would use, ever run on ``master``."""
    return master.commands_run("set", "evalsha", "eval")


# --- 6. waiters sleep ---------------------------------------------------------------------------


@pytest.mark.slow
def test_200_waiting_tasks_leave_the_masters_alone_then_all_acquire_in_turn(
    masters, redlock_of, monkeypatch
):
    holder = redlock_of(masters).lock("busy", ttl=10)
    engine = redlock_of(masters)
    joined = joins(engine, monkeypatch)
    queue_key = engine.queue_key("busy")

    async def take() -> None:
        async with engine.lock("busy", ttl=10, wait=10):
            pass

    async def main() -> tuple[int, Counter[str]]:
        await holder.aacquire()
        waiters = [asyncio.create_task(aoutcome(take())) for _ in range(200)]
        # All have joined the local queue, and the first of them waits on the masters.
        waiting = lambda: len(joined) == 200 and masters[0].call("ZCARD", queue_key) == 1  # noqa: E731
        assert await await_until(waiting, 10)
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


def test_waiting_tasks_take_a_released_lock_in_arrival_order(masters, redlock_of, monkeypatch):
    holder = redlock_of(masters).lock("fifo", ttl=10)
    engine = redlock_of(masters)
    arrived = joins(engine, monkeypatch)
    acquired: list[int] = []

    async def take(i: int) -> None:
        lock = engine.lock("fifo", ttl=10, wait=15)
        WAITER.set(i)
        async with lock:
            acquired.append(i)
            await asyncio.sleep(HOLD)

    async def main() -> Counter[str]:
        await holder.aacquire()
        waiters = []
        for i in range(QUEUED):
            waiters.append(asyncio.create_task(aoutcome(take(i))))
            await asyncio.sleep(0.01)
        assert await await_until(lambda: len(arrived) == QUEUED, 10)  # all in line
        await holder.arelease()
        return Counter(await asyncio.gather(*waiters))

    assert asyncio.run(main()) == {"ok": QUEUED}
    assert acquired == arrived


def test_waiting_threads_take_a_released_lock_in_arrival_order(masters, redlock_of, monkeypatch):
    holder = redlock_of(masters).lock("fifo", ttl=10).acquire()
    engine = redlock_of(masters)
    arrived = joins(engine, monkeypatch)
    acquired: list[int] = []

    def take(i: int) -> None:
        lock = engine.lock("fifo", ttl=10, wait=15)
        WAITER.set(i)
        with lock:
            acquired.append(i)
            time.sleep(HOLD)

    with concurrent.futures.ThreadPoolExecutor(QUEUED) as pool:
        waiters = []
        for i in range(QUEUED):
            waiters.append(pool.submit(outcome, functools.partial(take, i)))
            time.sleep(0.01)
        assert wait_until(lambda: len(arrived) == QUEUED, 10)  # all in line
        holder.release()
        assert Counter(w.result(STEP_TIMEOUT) for w in waiters) == {"ok": QUEUED}
    assert acquired == arrived


# --- 8. expiry hand-off -------------------------------------------------------------------------


def test_a_lease_that_expires_unreleased_passes_to_a_waiter_as_it_runs_out(
    masters, redlock_of, monkeypatch
):
    # No safety poll (put off past the test): only sleeping until the PTTL gets it in time.
    monkeypatch.setattr(procedures, "SAFETY_POLL", 30.0)
    held = redlock_of(masters).lock("expiring", ttl=1.0).acquire()  # never released
    pttls = [m.call("PTTL", held.key) for m in masters]
    expired = time.monotonic() + max(pttls) / 1000  # gone from every master by then
    # Polling every ~3 s would take the lock up to 3 s late (1.5 s at the soonest): only
    # sleeping until the PTTL won't. (1 s: a loaded machine's slack; 0.25 s was the bound.)
    waiter = redlock_of(masters, retry_delay=3.0).lock("expiring", ttl=5, wait=5)
    waiter.acquire()
    late = time.monotonic() - expired
    waiter.release()
    assert late <= 1.0, f"acquired {late:.3f} s after the lease expired on the masters"
    assert not held.held


# --- issue 23, item 11: locks over several resources queue like single ones ---------------------


def test_a_pair_lock_gets_its_turn_among_single_waiters_that_cycle(masters, redlock_of):
    """8 threads cycle on "a" (each waits its turn, then holds it 0.08 s); a lock over ("a", "b")
    with wait=2 queues among them, first come first served, and wins in every trial, as a single
    waiter would (about 0.7 s behind the 8: 0.12 s holds left too little margin at load 6 on
    Redis 6.2). It used to poll, and found "a" free in the short hand-offs between them 1 or 2
    times in 6 (a hand-off now never leaves it free)."""
    engine = redlock_of(masters)
    stop = threading.Event()

    def cycle() -> None:
        while not stop.is_set():
            with engine.lock("a", ttl=5, wait=10):
                time.sleep(0.08)

    threads = [threading.Thread(target=cycle) for _ in range(8)]
    for thread in threads:
        thread.start()
    won = 0
    try:
        time.sleep(0.3)  # the eight are cycling
        for _ in range(6):
            try:
                with engine.lock("a", "b", ttl=5, wait=2):
                    won += 1
            except LockContended:
                pass
    finally:
        stop.set()
        for thread in threads:
            thread.join(15)
    assert won == 6


def test_waiting_pair_locks_sleep_instead_of_polling(fresh_masters, redlock_of):
    """Pair locks (each in an engine of its own, as in separate processes) wait 2.5 s for a
    resource held all along: queued, each looks at most once per safety poll (plus its first
    tries), instead of every RETRY_DELAY (0.1 s: about 25 times each)."""
    masters = fresh_masters(3)
    holder = redlock_of(masters)
    pairs = [redlock_of(masters, retry_delay=0.1) for _ in range(4)]
    wait = 2.5
    with holder.lock("a", ttl=10):
        before = attempts_on(masters[0])
        with concurrent.futures.ThreadPoolExecutor(len(pairs)) as pool:
            tries = [
                pool.submit(engine.lock("a", f"b{i}", ttl=5, wait=wait).acquire)
                for i, engine in enumerate(pairs)
            ]
            for attempt in tries:
                with pytest.raises(LockContended):
                    attempt.result(timeout=15)
        looked = attempts_on(masters[0]) - before
    assert looked <= len(pairs) * (wait / SAFETY_POLL + 4), looked


def test_waiters_in_opposite_orders_in_one_process_do_not_deadlock(masters, redlock_of):
    """Threads of one process locking ("x", "y"), ("y", "x"), "x" and "y", each waiting its
    turn in the local queues of its resources: every one gets through, never two at once."""
    engine = redlock_of(masters)
    inside: list[str] = []
    overlaps = []
    done = Counter[str]()

    def work(resources: tuple[str, ...]) -> None:
        for _ in range(5):
            with engine.lock(*resources, ttl=5, wait=20):
                if any(r in inside for r in resources):
                    overlaps.append(resources)
                inside.extend(resources)
                time.sleep(0.002)
                for r in resources:
                    inside.remove(r)
            done[" ".join(resources)] += 1

    orders = [("x", "y"), ("y", "x"), ("x",), ("y",)] * 2
    with concurrent.futures.ThreadPoolExecutor(len(orders)) as pool:
        for finished in [pool.submit(work, order) for order in orders]:
            finished.result(timeout=30)
    assert overlaps == []
    assert sum(done.values()) == 5 * len(orders)


def test_a_pair_waiter_woken_in_vain_passes_the_turn_on(fresh_masters, redlock_of, monkeypatch):
    """A pair waiter first in "a"'s queue on the masters is woken by "a"'s release while "b" is
    still held: it cannot take "a", so it wakes the single waiter queued behind it there (who
    takes "a" at once) instead of leaving "a" free and its waiter asleep until its safety poll
    (put off past the test here, so that a loaded machine cannot make a poll pass for it; its
    next try is 3 s away), and keeps its own place in the queue."""
    monkeypatch.setattr(procedures, "SAFETY_POLL", 30.0)
    masters = fresh_masters(3)
    holders, pair_engine, single_engine = (redlock_of(masters, retry_delay=3) for _ in range(3))
    holding_a = holders.lock("a", ttl=10).acquire()
    holding_b = holders.lock("b", ttl=10).acquire()
    got_a: list[float] = []

    def single() -> None:
        with single_engine.lock("a", ttl=5, wait=5):
            got_a.append(time.monotonic())

    def both() -> None:
        with pair_engine.lock("a", "b", ttl=5, wait=5):
            pass

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        pair = pool.submit(both)
        assert wait_until(lambda: queued(masters, holders, {"a": 1, "b": 1}), 10)  # the pair
        waiter = pool.submit(single)
        assert wait_until(lambda: queued(masters, holders, {"a": 2, "b": 1}), 10)  # behind it
        released = time.monotonic()
        holding_a.release()
        waiter.result(timeout=10)
        assert got_a[0] - released < 2.0
        holding_b.release()
        pair.result(timeout=10)  # its turn came when "a" was free again


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_waiting_pair_lock_is_woken_by_the_release(fresh_masters, redlock_of, mode, monkeypatch):
    """A pair lock waiting for a held "a" is woken by name when it is released, sync or async,
    not after RETRY_DELAY (3 s here), its safety poll (put off past the test, so that a loaded
    machine cannot make a poll pass for the notice) or the holder's TTL (10 s)."""
    monkeypatch.setattr(procedures, "SAFETY_POLL", 30.0)
    masters = fresh_masters(3)
    holder, waiting = redlock_of(masters), redlock_of(masters, retry_delay=3)
    held = holder.lock("a", ttl=10).acquire()
    got: list[float] = []

    def pair() -> None:
        with waiting.lock("a", "b", ttl=5, wait=8):
            got.append(time.monotonic())

    async def apair() -> None:
        async with waiting.lock("a", "b", ttl=5, wait=8):
            got.append(time.monotonic())

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        done = pool.submit(pair if mode == "sync" else lambda: asyncio.run(apair()))
        # It lost, queued on the masters, and sleeps.
        assert wait_until(lambda: queued(masters, waiting, {"a": 1}), 10)
        released = time.monotonic()
        held.release()
        done.result(timeout=10)
    assert got[0] - released < 2.0


def test_pair_waiters_woken_in_vain_do_not_wake_each_other_without_end(fresh_masters, redlock_of):
    """Two pair locks ("a", "b") and ("b", "c"), in engines of their own, wait while "a" and "c"
    are held and "b" is released: the one woken cannot take "b" and passes its turn on only to
    a waiter for "b" alone (there is none), never to the other pair waiter, which would pass it
    back, and so on for as long as "a" and "c" are held."""
    masters = fresh_masters(3)
    holder = redlock_of(masters)
    pairs = [redlock_of(masters, retry_delay=3) for _ in range(2)]
    held = [holder.lock(r, ttl=10).acquire() for r in ("a", "b", "c")]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        waiting = [
            pool.submit(engine.lock(*resources, ttl=5, wait=2).acquire)
            for engine, resources in zip(pairs, [("a", "b"), ("b", "c")], strict=True)
        ]
        assert wait_until(lambda: queued(masters, holder, {"b": 2}), 10)  # both, on "b"
        held[1].release()
        before = attempts_on(masters[0])
        time.sleep(1.0)
        looked = attempts_on(masters[0]) - before
        for attempt in waiting:
            with pytest.raises(LockContended):
                attempt.result(timeout=10)
    assert looked <= 6, looked  # each: woken once, and a safety poll at most
