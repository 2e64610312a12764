"""Issue 20 (f), the cold burst: what one acquisition costs the event loop when a thousand tasks
ask at once. Each round's deadline and each queued acquisition's patience is a tuple on one heap
per loop, with one loop timer for the earliest (``engine/deadlines.py``), not a ``TimerHandle``
each; a master that is down is tried once a loop pass, not once a round; and a loop that ended is
not kept alive by the engine. Real masters, a real loop (counted, not replaced).
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import weakref

import pytest

from django_redlock.engine import deadlines, dialing
from django_redlock.engine.admission import IN_FLIGHT, Full, LoopGate

pytestmark = pytest.mark.timeout(60)


class CountingLoop(asyncio.SelectorEventLoop):
    """A plain selector loop that counts the timers it is asked for."""

    timers = 0

    def call_at(self, when, callback, *args, context=None):  # type: ignore[no-untyped-def,override]
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


def test_a_burst_asks_its_loop_for_a_handful_of_timers_not_one_per_round(masters, redlock_of):
    """300 tasks at once, each an acquisition and a release on 5 masters: 600 rounds, each with
    a deadline, and the 44 acquisitions beyond ``IN_FLIGHT`` queued with a patience each. The
    loop is asked for far fewer timers than that (before: one per round and one per queued
    acquisition, 644 here)."""
    engine = redlock_of(masters)
    tasks = IN_FLIGHT + 44

    async def one(i: int) -> None:
        async with engine.lock(f"timers:{i}", ttl=10, wait=0):
            pass

    async def burst() -> int:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, CountingLoop)
        async with engine.lock("timers:warm", ttl=10, wait=0):  # connected: no connect timers
            pass
        before = loop.timers
        await asyncio.gather(*(one(i) for i in range(tasks)))
        return loop.timers - before

    loop = CountingLoop()
    try:
        timers = loop.run_until_complete(burst())
    finally:
        loop.close()
    # (About one a node budget, 50 ms, the burst lasts: margin for a slow machine.)
    assert timers < tasks // 2, f"{timers} timers for {2 * tasks} rounds"


def test_a_deadline_fires_unless_its_future_is_done_first():
    """The earliest deadline is armed on the loop; one that was answered first does nothing; a
    later one still fires after an earlier one was answered."""
    fired: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        of = deadlines.of(loop)
        early, answered, late = loop.create_future(), loop.create_future(), loop.create_future()
        now = time.monotonic()
        of.call_at(now + 0.05, lambda f: fired.append("early") or f.set_result(None), early)
        of.call_at(now + 0.01, lambda f: fired.append("answered"), answered)
        of.call_at(now + 0.15, lambda f: fired.append("late") or f.set_result(None), late)
        answered.set_result(None)  # in time: its deadline must not fire
        await early
        assert fired == ["early"]
        assert time.monotonic() >= now + 0.05
        await late
        assert time.monotonic() >= now + 0.15

    asyncio.run(main())
    assert fired == ["early", "late"]


def test_answered_deadlines_are_swept_before_they_pile_up():
    """Many deadlines far away (an admission's patience is a minute) whose futures were answered
    long before: the heap is swept, so it holds about the live ones, not every one ever set."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        of = deadlines.of(loop)
        live = [loop.create_future() for _ in range(100)]
        for future in live:
            of.call_at(time.monotonic() + 60, deadlines.settle, future)
        for _ in range(20_000):
            future = loop.create_future()
            of.call_at(time.monotonic() + 60, deadlines.settle, future)
            future.set_result(None)  # answered at once
        for future in live:
            future.cancel()
        return len(of)

    assert asyncio.run(main()) < 5_000


def test_a_queued_round_is_refused_when_its_patience_runs_out():
    """A round that finds every turn taken waits its patience (the loop's deadlines), then is
    refused with ``Full``; one that finds a turn free takes it at once, without a future."""

    async def main() -> float:
        gate = LoopGate(asyncio.get_running_loop(), limit=1)
        assert gate.enter_at_once()
        assert not gate.enter_at_once()
        began = time.monotonic()
        with pytest.raises(Full):
            await gate.enter(0.2)
        return time.monotonic() - began

    assert asyncio.run(main()) >= 0.2


def test_a_loop_that_ended_is_not_kept_alive_by_the_engine(masters, redlock_of):
    """Each ``asyncio.run`` makes a new loop: once another loop has used the engine, the ended
    one is collectable (its flusher, which holds it, sat in a weak dictionary keyed by it, and
    every loop ever used stayed alive)."""
    engine = redlock_of(masters)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def cycle() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        async with engine.lock("loops", ttl=10, wait=0):
            pass

    for _ in range(3):
        asyncio.run(cycle())
    gc.collect()
    assert [ref() is None for ref in loops[:-1]] == [True, True]


def test_a_burst_with_a_master_down_tries_it_once_a_loop_pass_not_once_a_round(
    masters, redlock_of, monkeypatch
):
    """One of five masters refuses connections (nothing listens on its port): every acquisition
    and release still succeeds on the four others, and the rounds of one loop pass share one
    refused connect to it (before, each of the 400 rounds made its own, a socket and a refused
    connect()) while a later pass tries again."""
    attempts = []

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        attempts.append(time.monotonic())
        return connect(*args, **kwargs)

    connect = dialing.connect
    monkeypatch.setattr(dialing, "connect", counted)
    with socket.socket() as probe:  # a port nothing listens on (bound, then closed)
        probe.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{probe.getsockname()[1]}/0"
    engine = redlock_of([*masters[:4], dead])
    tasks = 200

    async def one(i: int) -> None:
        async with engine.lock(f"down:{i}", ttl=10, wait=0):
            pass

    async def burst() -> None:
        await asyncio.gather(*(one(i) for i in range(tasks)))
        attempts.clear()
        await asyncio.gather(*(one(i) for i in range(tasks)))  # the four others connected
        assert 2 <= len(attempts) < tasks // 4, f"{len(attempts)} connects for {2 * tasks} rounds"

    asyncio.run(burst())
