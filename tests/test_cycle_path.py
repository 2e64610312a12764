"""The uncontended cycle's round path (issue 20, target 1(a)): what the leaner round keeps.

A sync round decided by a quorum still takes the replies that came meanwhile (without waiting
for any); a round counts a master's answer as a vote exactly as before (the quorum, the
validity from the earliest request's departure, less drift); a master sent a script's source is
known to have it once it answered.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import signal
import sys
import threading
import time
from typing import Any

import pytest

from django_redlock.engine.algorithm import procedures
from django_redlock.engine.algorithm.procedures import Want
from django_redlock.engine.algorithm.steps import Round, granted
from django_redlock.engine.members import rounds
from django_redlock.engine.members.packing import pack
from django_redlock.engine.members.pipes import Pipe
from django_redlock.engine.members.slots import PENDING, Slot
from django_redlock.engine.running.drivers import afan_out, fan_out, run
from django_redlock.engine.scripts import plain as scripts
from tests.conftest import wait_until

#: How late the paused masters answer (seconds): the others' replies are there long before.
PAUSE_MS = 300


async def answered(slots: list[Slot], timeout: float = 2.0) -> None:
    """Let the loop run until each of ``slots`` (a loop pipe's) has its reply, or ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(slot.reply is PENDING for slot in slots) and time.monotonic() < deadline:
        await asyncio.sleep(0.001)


def test_a_sync_round_decided_at_quorum_reads_the_replies_already_there(masters, redlock_of):
    """A master answers late and is waited for first (it answered fastest lately); the four
    others answered at once: their replies are votes of the round, not given up on as unawaited
    (nor left owing), though the round was decided without waiting for two of them."""
    engine = redlock_of(masters, node_timeout=2.0)
    with engine.lock("cycle-path:warm", ttl=5):  # the threads' pipes, open
        pass
    nodes = engine.nodes
    for i, node in enumerate(nodes):
        assert node.pipe is not None
        node.pipe.latency = 0.0 if i == 0 else 1.0  # (the driver waits for the fastest first)
    masters[0].call("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    began = time.monotonic()
    replies = fan_out(nodes, ("SET", "cycle-path:late", "v", "NX", "PX", 5000), 2.0, None, granted)
    assert time.monotonic() - began >= PAUSE_MS / 1000 * 0.9  # it did wait for the paused one
    assert replies == [b"OK"] * 5
    assert not any(node.pipe is not None and node.pipe.owes for node in nodes)


def test_a_won_round_counts_validity_from_its_first_request_less_drift(masters, redlock_of):
    """A won attempt's lease ends at the round's ``began`` (read before its first request left)
    + TTL - drift, on the monotonic clock. (A drift of a second: no round on a loaded machine
    takes that long, so a validity that left it out would fall outside the bounds.)"""
    engine = redlock_of(masters, drift_factor=0.1)
    ttl = 10.0
    key = engine.lock_key("cycle-path:validity")
    want = Want("cycle-path:validity", ("cycle-path:validity",), (key,), ttl, 0.0, "v")
    before = time.monotonic()
    outcome = run(engine, procedures.attempt(engine, want, None, before + 1.0))
    after = time.monotonic()
    assert isinstance(outcome, procedures.Granted)
    drift = ttl * 0.1 + 0.002
    assert before + ttl - drift <= outcome.valid_until <= after + ttl - drift


@pytest.mark.parametrize("taken", [2, 3])
def test_a_round_wins_only_with_a_quorum_of_grants(masters, redlock_of, taken):
    """Masters already holding the key deny; the attempt wins iff a quorum (3 of 5) granted."""
    engine = redlock_of(masters)
    key = engine.lock_key("cycle-path:quorum")
    for master in masters[:taken]:
        master.call("SET", key, "someone else", "PX", 5000)
    want = Want("cycle-path:quorum", ("cycle-path:quorum",), (key,), 2.0, 0.0, "v")
    outcome = run(engine, procedures.attempt(engine, want, None, time.monotonic() + 1.0))
    if taken == 2:
        assert isinstance(outcome, procedures.Granted)
    else:
        assert isinstance(outcome, procedures.Lost)
        assert outcome.result.granted == 2
        assert [m.call("GET", key) for m in masters[taken:]] == [None] * (5 - taken)  # undone


def test_a_master_sent_a_scripts_source_is_known_to_have_it_once_it_answered(masters, redlock_of):
    """A new connection's first script request goes with its source (the master may have
    forgotten it); once a master answered it, it is sent the SHA."""
    engine = redlock_of(masters, node_timeout=2.0)
    nodes = engine.nodes
    fan_out(nodes, ("GET", "cycle-path:script"), 2.0)  # the pipes, open (they know no script)
    assert not any(scripts.HOLDS.sha in node.warm for node in nodes)
    holds = scripts.HOLDS.evalsha((engine.lock_key("cycle-path:script"),), ("v",))
    replies = fan_out(nodes, holds, 2.0, scripts.HOLDS)  # (every reply waited for)
    assert replies == [0] * 5
    assert all(scripts.HOLDS.sha in node.warm for node in nodes)


def test_an_async_requests_go_out_at_once_alone_and_together_in_one_tick(masters, redlock_of):
    """A loop's pipe writes a tick's first request at once and asks the loop for nothing (no
    end-of-tick callback: a lone round costs no loop pass for it); requests that follow in the
    same tick go out together at its end (one callback for them); once the loop read the pipe
    again, the next request is a new tick's first."""
    engine = redlock_of(masters)
    node = engine.nodes[0]
    ping = pack(("PING",))

    async def scenario() -> tuple[list[list[object]], list[object]]:
        loop = asyncio.get_running_loop()
        pipe = await node.aconnect(loop, 2.0)
        assert isinstance(pipe, Pipe)
        asked: list[object] = []
        call_soon = loop.call_soon

        def counted(callback: Any, *args: Any, **kwargs: Any) -> Any:
            asked.append(callback)
            return call_soon(callback, *args, **kwargs)

        loop.call_soon = counted  # type: ignore[method-assign,assignment]
        try:
            alone = pipe.send(ping, time.monotonic())
            after_alone = list(asked)
            together = [pipe.send(ping, time.monotonic()) for _ in range(3)]
            after_together = list(asked)
            slots = [alone, *together]
            assert all(slot is not None for slot in slots)
            await answered(slots)  # type: ignore[arg-type]
            before_next = len(asked)
            next_one = pipe.send(ping, time.monotonic())
            assert next_one is not None
            await answered([next_one])
            replies = [s.reply for s in [*slots, next_one]]  # type: ignore[union-attr]
            return [after_alone, after_together, asked[before_next:]], replies
        finally:
            del loop.call_soon  # (the instance's: the class's again)

    (after_alone, after_together, after_next), replies = asyncio.run(scenario())
    assert replies == [b"PONG"] * 5
    end_tick = "Flusher._end_tick"
    assert [getattr(c, "__qualname__", "") for c in after_alone] == []  # nothing asked of the loop
    assert [getattr(c, "__qualname__", "") for c in after_together] == [end_tick]  # one write
    assert end_tick not in [getattr(c, "__qualname__", "") for c in after_next]  # a new tick


def test_a_loop_pipe_read_in_mid_tick_writes_a_later_request_behind_the_queued_ones(
    masters, redlock_of
):
    """A tick's first request goes out at once and the next is queued for the tick's end; if the
    loop reads the pipe in between (its reader callback, dispatched in the same loop pass: a new
    tick for that pipe), a request made after that must still go out behind the queued one.

    It went out first, and each took the other's reply: here a SET NX refused (the key is held)
    would have been answered OK, a vote for a lock held by another on every master where the
    same happened. Seen as 1 run in 3-10 of a 1,000-task burst beside three other test files,
    where the swapped replies were of different kinds (TypeError in a release round)."""
    engine = redlock_of(masters)
    node = engine.nodes[0]
    masters[0].call("SET", "mid-tick:held", "theirs")

    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        pipe = await node.aconnect(loop, 2.0)
        assert isinstance(pipe, Pipe)
        sent = [
            pipe.send(pack(("ECHO", "first")), time.monotonic()),  # out at once
            pipe.send(pack(("SET", "mid-tick:held", "ours", "NX")), time.monotonic()),  # queued
        ]
        pipe._readable()  # noqa: SLF001 (the loop's reader callback, run in mid-tick)
        sent.append(pipe.send(pack(("SET", "mid-tick:free", "ours", "NX")), time.monotonic()))
        slots = [slot for slot in sent if slot is not None]
        assert len(slots) == 3
        await answered(slots)
        return [s.reply for s in slots]

    assert asyncio.run(scenario()) == [b"first", None, b"OK"]  # refused where held, granted


@pytest.mark.parametrize("seed", range(5))
def test_a_loop_pipes_replies_reach_their_own_requests_however_calls_and_reads_interleave(
    masters, redlock_of, seed
):
    """The invariant behind the test above, searched: requests made in any interleaving with the
    loop's passes and with reads of the pipe in mid-tick each get their own reply (ECHO of a
    payload of their own). Trips on the code before that fix for every seed here."""
    import random

    engine = redlock_of(masters)
    node = engine.nodes[0]
    rng = random.Random(seed)

    async def scenario() -> list[tuple[object, bytes]]:
        loop = asyncio.get_running_loop()
        pipe = await node.aconnect(loop, 2.0)
        assert isinstance(pipe, Pipe)
        asked = []
        for i in range(300):
            step = rng.random()
            if step < 0.6:
                payload = f"request {i}".encode()
                slot = pipe.send(pack(("ECHO", payload)), time.monotonic())
                assert slot is not None
                asked.append((slot, payload))
            elif step < 0.8:
                pipe._readable()  # noqa: SLF001 (the loop's reader callback, in mid-tick)
            else:
                await asyncio.sleep(0)  # a loop pass: the tick's end, the real reader
        await answered([s for s, _ in asked])
        return [(s.reply, payload) for s, payload in asked]

    replies = asyncio.run(scenario())
    assert [reply for reply, _ in replies] == [payload for _, payload in replies]


class _Interrupted(Exception):
    """What the test's timer raises in the waiting thread (as Ctrl-C would)."""


def test_a_sync_round_interrupted_while_waiting_gives_up_its_replies(masters, redlock_of):
    """A thread's round waits for its replies in place (not through its driver): interrupted
    there, it gives up the slots still waiting, as the driver did (their replies are dropped
    when they come, and each pipe owes them); the next round on the same pipes gets its own."""
    engine = redlock_of(masters, node_timeout=2.0)
    nodes = engine.nodes
    fan_out(nodes, ("GET", "cycle-path:interrupted"), 2.0)  # the threads' pipes, open
    for master in masters:
        master.call("CLIENT", "PAUSE", 600, "WRITE")  # the SET waits 600 ms; the timer, 100

    def interrupt(signum: int, frame: object) -> None:
        raise _Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(_Interrupted):
            fan_out(nodes, ("SET", "cycle-path:interrupted", "v", "PX", 5000), 2.0, None, granted)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    pipes = [node.pipe for node in nodes]
    assert all(pipe is not None and pipe.owes for pipe in pipes)  # given up, still owed
    replies = fan_out(nodes, ("GET", "cycle-path:interrupted"), 2.0)  # after the SETs, in order
    assert replies == [b"v"] * 5
    assert [node.pipe for node in nodes] == pipes  # the same pipes: none was closed
    assert not any(pipe.owes for pipe in pipes if pipe is not None)


def test_a_thread_round_writes_straight_to_an_idle_pipe_and_behind_a_busy_ones_requests(
    masters, redlock_of, monkeypatch
):
    """A thread's round writes its request straight to a master whose pipe has nothing in
    flight (``Pipe.write``, not through ``Pipe.send``); a round that finds another thread's
    requests still in flight there takes the general way, queued behind them: each reply still
    goes to its own round, in order (the GET, sent while the SET waited, reads what it wrote)."""
    engine = redlock_of(masters, node_timeout=2.0)
    nodes = engine.nodes
    key = "cycle-path:straight"
    fan_out(nodes, ("GET", key), 2.0)  # the threads' pipes, open
    through: list[Pipe] = []
    general = Pipe.send

    def counted(self: Pipe, request: bytes, now: float, *args: Any, **kwargs: Any) -> Any:
        through.append(self)
        return general(self, request, now, *args, **kwargs)

    monkeypatch.setattr(Pipe, "send", counted)
    assert fan_out(nodes, ("GET", key), 2.0) == [None] * 5
    assert through == []  # idle pipes: written straight
    for master in masters:
        master.call("CLIENT", "PAUSE", 800, "WRITE")  # the SET is answered 800 ms later
    first: list[object] = []
    writer = threading.Thread(
        target=lambda: first.append(fan_out(nodes, ("SET", key, "v", "PX", 5000), 2.0))
    )
    writer.start()
    assert wait_until(lambda: all(n.pipe is not None and n.pipe.pending for n in nodes), 2.0)
    second = fan_out(nodes, ("GET", key), 2.0)  # while the SETs are in flight
    writer.join(5.0)
    assert first == [[b"OK"] * 5]
    assert second == [b"v"] * 5  # behind the SET on each pipe, its own reply
    assert set(through) == {node.pipe for node in nodes}  # the busy pipes: the general way


def _straight_line() -> int:
    """The line of ``exchange`` that writes a request straight to an idle pipe."""
    lines, first = inspect.getsourcelines(rounds.exchange)
    found = [first + n for n, line in enumerate(lines) if "slot = pipe.write(packed)" in line]
    assert len(found) == 1, found
    return found[0]


def test_an_async_round_writes_straight_to_an_idle_loop_pipe_and_behind_a_busy_ones_requests(
    masters, redlock_of
):
    """As a thread's round: a loop's round writes straight to the masters whose pipe has nothing
    in flight (the line that does it runs once per master); one that finds another task's
    requests in flight takes the general way (that line never runs), queued behind them, and
    each reply still goes to its own round."""
    engine = redlock_of(masters, node_timeout=2.0)
    key = "cycle-path:straight-async"
    straight, code = _straight_line(), rounds.exchange.__code__
    hits: list[int] = []

    def line_of(frame: Any, event: str, arg: object) -> Any:
        if event == "line" and frame.f_lineno == straight:
            hits.append(straight)
        return line_of

    def tracer(frame: Any, event: str, arg: object) -> Any:
        return line_of if frame.f_code is code else None

    async def traced(command: tuple[Any, ...]) -> tuple[object, int]:
        hits.clear()
        sys.settrace(tracer)
        try:
            replies = await afan_out(engine, Round(command))
        finally:
            sys.settrace(None)
        return replies, len(hits)

    async def scenario() -> list[object]:
        loop = asyncio.get_running_loop()
        await afan_out(engine, Round(("GET", key)))  # the loop's pipes, open
        idle = await traced(("GET", key))
        for master in masters:
            master.call("CLIENT", "PAUSE", 800, "WRITE")  # the SET is answered 800 ms later
        writer = asyncio.ensure_future(afan_out(engine, Round(("SET", key, "v", "PX", 5000))))
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and not all(
            (pipe := node.loop_pipe(loop)) is not None and pipe.pending for node in engine.nodes
        ):
            await asyncio.sleep(0.005)
        busy = await traced(("GET", key))  # while the SETs are in flight
        return [idle, await writer, busy]

    idle, written, busy = asyncio.run(scenario())
    assert idle == ([None] * 5, 5)  # five requests written straight
    assert written == [b"OK"] * 5
    assert busy == ([b"v"] * 5, 0)  # behind the SETs, the general way: its own replies


class _EmptiedAfterTheTest(collections.deque):  # type: ignore[type-arg]
    """A pipe's queue as a round that tested it saw it just before another thread's read took
    its last slot: non-empty to the test, empty to the read that follows."""

    def __bool__(self) -> bool:
        return True

    def __len__(self) -> int:
        return 1


def test_a_pipe_emptied_by_another_threads_read_meanwhile_neither_owes_nor_stalls(
    masters, redlock_of
):
    """``owes`` and ``stalled`` read the oldest slot once: a queue another thread's read emptied
    between a round's test for emptiness and its read of the oldest slot is an idle pipe, not an
    ``IndexError`` out of the round."""
    engine = redlock_of(masters, node_timeout=2.0)
    fan_out(engine.nodes, ("GET", "cycle-path:emptied"), 2.0)
    pipe = engine.nodes[0].pipe
    assert pipe is not None
    pipe.pending = _EmptiedAfterTheTest()
    assert pipe.owes is False
    assert pipe.stalled(time.monotonic(), 0.0) is False
