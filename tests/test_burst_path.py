"""Issue 20 (f), the cold burst: what one acquisition costs the event loop when a thousand tasks
ask at once. Each round's deadline and each queued acquisition's patience is a tuple on one heap
per loop, with one loop timer for the earliest (``engine/base/deadlines.py``), not a ``TimerHandle``
each; a master that is down is tried once a loop pass, not once a round; and a loop that ended is
not kept alive by the engine. Real masters, a real loop (counted, not replaced).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import socket
import threading
import time
import weakref

import pytest

from django_redlock.engine.algorithm import holding
from django_redlock.engine.algorithm.steps import Round
from django_redlock.engine.base import deadlines, values
from django_redlock.engine.base.values import make_value, parse_value
from django_redlock.engine.members import dialing
from django_redlock.engine.running.drivers import fan_out
from django_redlock.engine.waiting import admission
from django_redlock.engine.waiting.admission import IN_FLIGHT, Full, LoopGate, ThreadGate

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


# --- whose round goes next when turns are scarce ------------------------------------------------


def _admitted_order(holder_waited: float, behind: float) -> list[str]:
    """One turn (limit 1), taken; two acquisitions queue, then a holder's round (a release that
    lets those queued before it go first for ``behind`` seconds), and after ``holder_waited``
    seconds the turn is given on three times: the order they got it."""
    order: list[str] = []

    async def main() -> None:
        gate = LoopGate(asyncio.get_running_loop(), limit=1)
        assert gate.enter_at_once()

        async def queued(name: str, patience: float | None) -> None:
            await gate.enter(patience, behind)
            order.append(name)

        tasks = []
        for name, patience in (("acquisition 1", 10.0), ("acquisition 2", 10.0), ("release", None)):
            tasks.append(asyncio.create_task(queued(name, patience)))
            await asyncio.sleep(0)  # queued in this order
        await asyncio.sleep(holder_waited)
        for _ in tasks:
            gate.leave()
            await asyncio.sleep(0)  # the task that got the turn runs
        await asyncio.gather(*tasks)

    asyncio.run(main())
    return order


def test_acquisitions_queued_before_a_release_get_their_turn_before_it():
    """A release that lets earlier acquisitions go first waits for them (before, every holder's
    round went first, and a burst's last acquisitions waited behind nearly every release of the
    burst). (A long ``behind``: a loaded machine's pause must not decide the order.)"""
    assert _admitted_order(0.0, behind=5.0) == ["acquisition 1", "acquisition 2", "release"]


def test_a_release_goes_first_once_it_has_let_acquisitions_go_first_long_enough():
    """A holder's round that has waited its ``behind`` goes ahead of every acquisition (its
    lease's clock runs while it waits); one with none (a fence read, a clean-up) at once."""
    assert _admitted_order(0.15, behind=0.05) == ["release", "acquisition 1", "acquisition 2"]
    assert _admitted_order(0.0, behind=0.0) == ["release", "acquisition 1", "acquisition 2"]


def test_threads_take_turns_in_the_same_order():
    """The threads' gate follows the same rule."""

    def order(holder_waited: float, behind: float) -> list[str]:
        gate, got = ThreadGate(limit=1), []
        gate.enter(10.0)
        threads = []
        for name, patience in (("acquisition", 10.0), ("release", None)):

            def queued(name: str = name, patience: float | None = patience) -> None:
                gate.enter(patience, behind)
                got.append(name)
                gate.leave()

            threads.append(threading.Thread(target=queued))
            threads[-1].start()
            deadline, expected = time.monotonic() + 5, len(threads)
            while len(gate.holders) + len(gate.waiting) < expected and time.monotonic() < deadline:
                time.sleep(0.001)  # queued in this order
        time.sleep(holder_waited)
        gate.leave()
        for thread in threads:
            thread.join(5)
        return got

    assert order(0.0, behind=5.0) == ["acquisition", "release"]
    assert order(0.2, behind=0.05) == ["release", "acquisition"]


def test_a_release_or_renewal_lets_earlier_acquisitions_go_first_a_tenth_of_its_lease(
    masters, redlock_of
):
    """What a holder's release and renewal rounds let queued acquisitions have: a tenth of what
    is left of the lease (it reaches the masters well within it), at most ``HOLDER_PATIENCE``;
    nothing once the lease ran out. Driven step by step, with real rounds."""
    now = time.monotonic()
    assert admission.holder_patience(now + 30.0) == admission.HOLDER_PATIENCE
    assert 0.09 < admission.holder_patience(now + 1.0) <= 0.1
    assert admission.holder_patience(now - 1.0) == 0.0
    engine = redlock_of(masters)
    lock = engine.lock("patience", ttl=2.0).acquire()
    lease = engine.holders[lock.key]
    for procedure in (holding.extend(engine, lease, once=True), holding.release(engine, lease)):
        step = next(procedure)
        assert 0.1 < step.behind <= 0.2  # (a tenth of the 2 s lease's validity left)
        replies = fan_out(engine.nodes, step.command, engine.node_timeout, step.script)
        with pytest.raises(StopIteration):
            procedure.send(replies)
    assert {m.client().get(lock.key) for m in masters} == {None}  # released


@pytest.mark.parametrize("label", [None, 'a "quoted" ,"since":1.5} label', "ünï ✓"])
@pytest.mark.parametrize("task", [None, "Task-7", 'Задача "\\\n'])
@pytest.mark.parametrize("ttl", [0.01, 10.0, 86_400.25])
def test_the_owner_json_of_a_new_task_is_the_json_of_its_fields(label, task, ttl):
    """A burst makes a value per new task: the owner JSON around the task's name is encoded once
    per thread and the name alone each time; the text is still exactly ``json.dumps``' of the
    fields (readers parse it)."""
    value = make_value(label, ttl, task)
    fields: dict[str, object] = {"host": socket.gethostname(), "pid": os.getpid()}
    fields["thread"] = threading.current_thread().name
    fields |= {"task": task} if task is not None else {}
    fields |= {"label": label} if label is not None else {}
    fields["ttl"] = ttl
    since = value.rindex(',"since":')
    assert value[33:since] == json.dumps(fields, separators=(",", ":"))[:-1]
    assert parse_value(value.encode())[1].task == task


def _script_calls(master) -> tuple[int, int]:
    stats = master.client().info("commandstats")
    return tuple(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("eval", "evalsha"))


def test_a_cold_burst_sends_a_scripts_source_once_per_connection(fresh_masters, redlock_of):
    """200 tasks of a fresh engine acquire and release at once: every release is a script, and
    most are written before the first one's answer comes back. Its source goes once per
    connection (Redis runs a connection's requests in order: the first loads it for the rest),
    not with each of them until a master answered (about 1.2 KB a request)."""
    masters = fresh_masters(3)
    engine = redlock_of(masters, node_timeout=2.0)

    async def one(n: int) -> None:
        async with engine.lock(f"burst:{n}", ttl=10):
            pass

    async def burst() -> None:
        await asyncio.gather(*(one(n) for n in range(200)))

    asyncio.run(burst())
    for master in masters:
        sourced, by_sha = _script_calls(master)
        assert sourced == 1, (sourced, by_sha)  # one connection (the loop's), one script
        assert by_sha == 199


# --- a release waits for its turn before it is made ---------------------------------------------


def _live(kind: type) -> int:
    return sum(type(o) is kind for o in gc.get_objects())


def test_a_queued_release_is_made_only_once_its_turn_comes(masters, redlock_of):
    """Every turn taken (a burst's acquisitions ahead): releases queue for their round's turn
    with their procedure not begun, no round or request built yet (a burst's last acquisitions
    waited behind every release's making, and the collector went through each one's round and
    generators while it waited). Once turns are given, each is made and reaches the masters.
    (Before: one ``Round`` per queued release, built before it queued.)"""
    engine = redlock_of(masters)
    releases = 20

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        locks = [
            await engine.lock(f"queued-release:{i}", ttl=10).aacquire() for i in range(releases)
        ]
        gate = engine.admission.of(loop)
        taken = 0
        while gate.enter_at_once():  # every turn taken
            taken += 1
        rounds_before = _live(Round)
        tasks = [loop.create_task(lock.arelease()) for lock in locks]
        for _ in range(5):
            await asyncio.sleep(0)
        queued, built = len(gate.holders), _live(Round) - rounds_before
        for _ in range(taken):
            gate.leave()
        await asyncio.gather(*tasks)
        return queued, built

    queued, built = asyncio.run(main())
    assert queued == releases
    assert built == 0
    assert [
        m.client().exists(*[engine.lock_key(f"queued-release:{i}") for i in range(releases)])
        for m in masters
    ] == [0] * len(masters)


def test_a_release_cancelled_while_it_waits_for_its_turn_still_releases(masters, redlock_of):
    """Cancelled while queued for its round's turn, a release is still made (shielded) before
    the cancellation goes on: the key is gone from every master."""
    engine = redlock_of(masters)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        lock = await engine.lock("cancelled-release", ttl=10).aacquire()
        gate = engine.admission.of(loop)
        taken = 0
        while gate.enter_at_once():
            taken += 1
        release = loop.create_task(lock.arelease())
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(gate.holders) == 1
        release.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        for _ in range(taken):
            gate.leave()
        with pytest.raises(asyncio.CancelledError):
            await release
        for _ in range(100):  # its clean-up round, shielded, finishes in the background
            if not any(m.client().exists(engine.lock_key("cancelled-release")) for m in masters):
                break
            await asyncio.sleep(0.02)

    asyncio.run(main())
    assert [m.client().exists(engine.lock_key("cancelled-release")) for m in masters] == [0] * 5


def test_a_bursts_leases_keep_their_values_parts_as_made_not_read_back(
    masters, redlock_of, monkeypatch
):
    """Fifty tasks acquire at once: each lease keeps its value in parts (``compact_value``'s)
    taken as its value was made, long before (fifty values later), not parsed back from the
    value's text (before: 50 read back, in a 1,000-task burst 3 % of the work its last
    acquisitions waited behind); each is still exactly the value on the masters."""
    parsed = []

    def counted(value: str) -> tuple[bytes, str]:
        parsed.append(value)
        return compact(value)

    compact = values.compact_value
    monkeypatch.setattr(values, "compact_value", counted)
    engine = redlock_of(masters)

    client = masters[0].client()
    seen = []

    async def checked() -> None:
        for lock_task in asyncio.as_completed([one_checked(i) for i in range(50)]):
            seen.append(await lock_task)

    async def one_checked(i: int) -> bool:
        lock = await engine.lock(f"parts:{i}", ttl=10, wait=0).aacquire()
        held = engine.holders[lock.key].value
        stored = client.get(lock.key)
        await lock.arelease()
        return stored is not None and stored.decode() == held

    asyncio.run(checked())
    assert seen == [True] * 50
    assert len(parsed) == 0  # (not the values themselves: a failure would print tokens)
