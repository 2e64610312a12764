"""Issue 10, many callers in one process: connections that do not grow with concurrency, a lease
per acquisition (never per reusable thread or task id), and owner metadata that names the holder
now. Black box: the public API, and the masters read with plain redis clients.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_redlock.engine import Lock
from django_redlock.engine.running.watchdog import WATCHDOG
from django_redlock.testing.masters import LocalMaster
from tests.callers import (
    STEP_TIMEOUT,
    Caller,
    TaskCaller,
    acquire_release,
    aoutcome,
    run_thread,
    stored_owners,
    stored_values,
)

pytestmark = pytest.mark.timeout(60)  # many threads and tasks: a hang must fail, not stall


def lock_path_connections(masters: list[LocalMaster]) -> list[int]:
    """Per master, its clients but this inspection and pub/sub ones (release notices)."""
    counts = []
    for m in masters:
        with m.client() as client:
            clients = client.client_list()
        counts.append(
            sum(
                c["cmd"] != "client|list"
                and all(c.get(f, "0") == "0" for f in ("sub", "psub", "ssub"))
                for c in clients
            )
        )
    return counts


def new_connections(masters: list[LocalMaster], baseline: list[int]) -> list[int]:
    """Lock-path connections per master beyond ``baseline``, once at most 2 everywhere, or as
    they are 2 s later (an idle extra may take a moment to close)."""
    deadline = time.monotonic() + 2
    while True:
        extra = [n - b for n, b in zip(lock_path_connections(masters), baseline, strict=True)]
        if max(extra) <= 2 or time.monotonic() > deadline:
            return extra
        time.sleep(0.1)


def assert_all_acquired_on_few_connections(
    outcomes: Counter[str], calls: int, extra: list[int]
) -> None:
    where = f"new lock-path connections per master: {extra}"
    assert outcomes == {"ok": calls}, where
    assert max(extra) <= 2, where


@pytest.fixture(params=["threads", "tasks"])
def callers(request: pytest.FixtureRequest) -> Iterator[Callable[[], Caller]]:
    """Make callers: threads, or asyncio tasks of one event loop."""
    made: list[Caller] = []
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()

    def make() -> Caller:
        made.append(Caller() if request.param == "threads" else TaskCaller(loop))
        return made[-1]

    yield make
    for caller in made:
        caller.stop()
    loop.call_soon_threadsafe(loop.stop)
    runner.join(STEP_TIMEOUT)
    loop.close()


# --- 1. connections do not grow with concurrency ----------------------------------------------


def test_1000_tasks_on_distinct_keys_all_acquire_on_at_most_2_connections_per_master(
    masters, redlock_of
):
    baseline = lock_path_connections(masters)
    engine = redlock_of(masters, node_timeout=1.0)  # (what it tests is connections, not time)

    async def hold(i: int) -> None:
        async with engine.lock(f"burst{i}", ttl=10, wait=0):
            await asyncio.sleep(0.02)

    async def burst() -> tuple[Counter[str], list[int]]:
        outcomes = Counter(await asyncio.gather(*(aoutcome(hold(i)) for i in range(1000))))
        return outcomes, await asyncio.to_thread(new_connections, masters, baseline)

    outcomes, extra = asyncio.run(burst())
    assert_all_acquired_on_few_connections(outcomes, 1000, extra)


@pytest.mark.slow
def test_200_threads_cycling_on_distinct_keys_all_acquire_on_at_most_2_connections_per_master(
    masters, redlock_of
):
    baseline = lock_path_connections(masters)
    engine = redlock_of(masters, node_timeout=1.0)  # (what it tests is connections, not time)
    start = threading.Barrier(200)

    def cycles(i: int) -> list[str]:
        start.wait()
        return [acquire_release(engine.lock(f"thread{i}", ttl=10, wait=0)) for _ in range(10)]

    with concurrent.futures.ThreadPoolExecutor(200) as pool:
        outcomes = Counter(itertools.chain.from_iterable(pool.map(cycles, range(200))))
    extra = new_connections(masters, baseline)
    assert_all_acquired_on_few_connections(outcomes, 2000, extra)


# --- 2. a shared handle gives each caller its own lease ---------------------------------------


def test_a_handle_shared_by_two_callers_gives_each_its_own_lease(masters, redlock_of, callers):
    engine = redlock_of(masters)
    a, b = callers(), callers()
    lock = engine.lock("shared", ttl=10, wait=0)
    seen = {"A acquires": a.ask(lock, "acquire")}
    a_value = stored_values(masters, lock.key)
    seen |= {
        "B acquires while A holds": b.ask(lock, "acquire"),
        "held in A": a.ask(lock, "held"),
        "held in B": b.ask(lock, "held"),
        "validity in B": b.ask(lock, "validity"),
        "check in B": b.ask(lock, "check"),
        "release in B": b.ask(lock, "release"),
        "A's lease untouched on the masters": stored_values(masters, lock.key) == a_value,
        "still held in A": a.ask(lock, "held"),
        "check in A": a.ask(lock, "check"),
        "A releases": a.ask(lock, "release"),
    }
    waiting = engine.lock("shared-wait", ttl=10, wait=5)
    seen["A acquires to make B wait"] = a.ask(waiting, "acquire")
    b_acquires = b.submit(waiting, "acquire")
    time.sleep(0.3)
    seen["B still waiting"] = not b_acquires.done()
    seen["A releases to B"] = a.ask(waiting, "release")
    seen["B acquires after A"] = b_acquires.result(STEP_TIMEOUT)
    seen |= {
        "held in B after A": b.ask(waiting, "held"),
        "held in A after B took it": a.ask(waiting, "held"),
        "B releases": b.ask(waiting, "release"),
    }
    assert seen == {
        "A acquires": "ok",
        "B acquires while A holds": "LockContended",
        "held in A": True,
        "held in B": False,
        "validity in B": "zero",
        "check in B": "RuntimeError",
        "release in B": "RuntimeError",
        "A's lease untouched on the masters": True,
        "still held in A": True,
        "check in A": "ok",
        "A releases": "ok",
        "A acquires to make B wait": "ok",
        "B still waiting": True,
        "A releases to B": "ok",
        "B acquires after A": "ok",
        "held in B after A": True,
        "held in A after B took it": False,
        "B releases": "ok",
    }
    assert stored_values(masters, waiting.key) == [None] * len(masters)


# --- 3. identities are not reused ---------------------------------------------------------------

#: Threads (one at a time), or batches of 50 tasks (at once), made to get the ended one's id again.
REUSE_TRIES = 20


def test_a_new_task_is_not_taken_for_an_ended_task_that_held_a_reentrant_lock(masters, redlock_of):
    engine = redlock_of(masters)
    kept: list[Lock] = []  # the ended task's handle: its lease stays on the masters

    async def hold() -> tuple[int, list[bytes | None]]:
        lock = await engine.lock("r", ttl=30, reentrant=True).aacquire()
        kept.append(lock)
        # Read now: once the task has ended, anything allocated may take its memory (and id).
        return id(asyncio.current_task()), stored_values(masters, lock.key)

    async def reenter(ended: int | None) -> str | None:
        """From a task with the ended task's id (any task if ``ended`` is None), re-enter."""
        if ended is not None and id(asyncio.current_task()) != ended:
            return None
        return await aoutcome(engine.lock("r", ttl=30, reentrant=True, wait=0).aacquire())

    async def main() -> tuple[list[bytes | None], str | None, bool]:
        ended, before = await asyncio.create_task(hold())
        await asyncio.sleep(0)  # the loop lets go of the ended task: its memory is free
        for _ in range(REUSE_TRIES):
            # Made at once, one of them is likely to take that memory, hence the id.
            for got in await asyncio.gather(*(reenter(ended) for _ in range(50))):
                if got is not None:
                    return before, got, True
        return before, await asyncio.create_task(reenter(None)), False

    before, got, reused = asyncio.run(main())
    assert got == "LockContended", f"the ended task's id was reused: {reused}"
    assert stored_values(masters, kept[0].key) == before  # the old holder's lease, untouched


def test_a_new_thread_is_not_taken_for_an_ended_thread_that_held_a_reentrant_lock(
    masters, redlock_of
):
    engine = redlock_of(masters)
    kept: list[Lock] = []

    def hold() -> int:
        kept.append(engine.lock("r", ttl=30, reentrant=True).acquire())
        return threading.get_ident()

    def reenter(ended: int | None) -> str | None:
        """From a thread with the ended thread's ident (any if ``ended`` is None), re-enter."""
        if ended is not None and threading.get_ident() != ended:
            return None
        return acquire_release(engine.lock("r", ttl=30, reentrant=True, wait=0))

    ended = run_thread(hold)
    before = stored_values(masters, kept[0].key)
    reused = False
    for _ in range(REUSE_TRIES):  # the next thread usually gets the same ident
        got = run_thread(functools.partial(reenter, ended))
        if reused := got is not None:
            break
    else:
        got = run_thread(functools.partial(reenter, None))
    assert got == "LockContended", f"the ended thread's ident was reused: {reused}"
    assert stored_values(masters, kept[0].key) == before


# --- 4. wait_for around aacquire ----------------------------------------------------------------


def test_release_after_wait_for_acquire_frees_the_lock_and_stops_its_renewal(masters, redlock_of):
    engine = redlock_of(masters)
    lock = engine.lock("waited-for", ttl=1.0, auto_extend=True)  # renewed every 1/3 s
    watched = WATCHDOG.watching

    async def main() -> tuple[bool, str]:
        await asyncio.wait_for(lock.aacquire(), 5)  # on 3.11: acquired in an inner task
        held = lock.held
        released = await aoutcome(lock.arelease())
        await asyncio.sleep(0.7)  # more than two renewal periods: nothing may happen meanwhile
        return held, released

    held, released = asyncio.run(main())
    assert (held, released) == (True, "ok")
    assert stored_values(masters, lock.key) == [None] * len(masters)
    assert WATCHDOG.watching <= watched, "the watchdog still renews the released lease"


# --- 5. owner metadata names the holder now ---------------------------------------------------


def test_owner_metadata_names_the_thread_that_holds_the_lock_now(masters, redlock_of):
    engine = redlock_of(masters)

    def hold() -> tuple[int, set[str]]:
        with engine.lock("meta", ttl=10, label="job") as lock:
            return threading.get_ident(), {o["thread"] for o in stored_owners(masters, lock.key)}

    first_ident, first = run_thread(hold, name="worker-A")
    second_ident, second = run_thread(hold, name="worker-B")
    same = f"same thread ident: {first_ident == second_ident}"
    assert (first, second) == ({"worker-A"}, {"worker-B"}), same


def test_owner_metadata_names_the_task_that_holds_the_lock(masters, redlock_of):
    engine = redlock_of(masters)

    async def hold() -> list[dict[str, Any]]:
        async with engine.lock("meta", ttl=10) as lock:
            return stored_owners(masters, lock.key)

    async def main() -> list[dict[str, Any]]:
        return await asyncio.create_task(hold(), name="job-7")

    owners = [(o.get("thread"), o.get("task")) for o in asyncio.run(main())]
    assert owners == [("MainThread", "job-7")] * len(masters)
