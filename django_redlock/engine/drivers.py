"""Every blocking and every awaiting line of the engine, sync and async side by side.

``run``/``arun`` perform a procedure's steps (``procedures``); ``fan_out``/``afan_out`` perform a
round's waits (``rounds.exchange``). Threads share one pipe per master and wait on it in turn;
asyncio rounds use their loop's pipe, whose replies a reader callback hands out, and wait on one
future per round (a task or timeout scope per master would cost more than a loopback round trip).
If a step is interrupted (a cancelled task, Ctrl-C, an error), the exception is thrown into the
procedure, which may yield clean-up steps (undo a half-done acquisition; the async runner shields
them from a second cancellation) before it re-raises.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any, TypeVar

from .connections import Node
from .detours import Delay
from .notices import Waiter
from .pipes import PENDING, Pipe, Slot
from .rounds import (
    ANSWERS,
    Command,
    Connect,
    Decides,
    Exchange,
    Replies,
    RoundReplies,
    exchange,
    second_try,
)
from .scripts import Script
from .steps import (
    AwaitNotice,
    AwaitTurn,
    Detach,
    Listen,
    Masters,
    Pause,
    Procedure,
    Round,
    Step,
)

T = TypeVar("T")


# --- threads ------------------------------------------------------------------------------------


def run(masters: Masters, procedure: Procedure[T]) -> T:
    """Perform a procedure's steps with blocking waits."""
    answer: Any = None
    error: BaseException | None = None
    waiters: list[Waiter] = []
    try:
        while True:
            try:
                step = procedure.throw(error) if error else procedure.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            error = None
            try:
                answer = _perform(masters, step, waiters)
            except BaseException as exc:  # noqa: BLE001 (handed to the procedure, re-raised there)
                error = exc
    finally:
        for waiter in waiters:
            masters.notices.unlisten(waiter)


def _perform(masters: Masters, step: Step, waiters: list[Waiter]) -> Any:
    if isinstance(step, Round):
        gate = masters.admission.threads()
        gate.enter(step.patience)
        try:
            return fan_out(
                masters.nodes, step.command, masters.node_timeout, step.script, step.enough
            )
        finally:
            gate.leave()
    if isinstance(step, Pause):
        time.sleep(step.seconds)
        return None
    if isinstance(step, Listen):
        waiter = masters.notices.listen()
        waiters.append(waiter)
        waiter.subscribed.wait(masters.node_timeout)
        return waiter
    if isinstance(step, AwaitTurn):
        return step.turn.ready.wait(step.timeout)
    if isinstance(step, Detach):
        threading.Thread(target=run, args=(masters, step.procedure), daemon=True).start()
        return None
    notified = step.waiter.notified.wait(step.timeout)
    step.waiter.notified.clear()
    return notified


def _threads_pipe(node: Node) -> Pipe | None:
    pipe = node.pipe
    return None if pipe is None or pipe.closed else pipe


def fan_out(
    nodes: Sequence[Node],
    command: Command,
    budget: float,
    script: Script | None = None,
    enough: Decides | None = None,
) -> RoundReplies:
    """One round (``rounds.exchange``) with blocking waits, on the threads' pipes."""
    rounds = exchange(nodes, command, budget, _threads_pipe, script, enough)
    answer: object = None
    while True:
        try:
            wait = rounds.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer = None
        try:
            if isinstance(wait, Replies):
                _wait_replies(wait)
            elif isinstance(wait, Delay):  # (a Cluster shard's TRYAGAIN: detours)
                time.sleep(max(0.0, wait.until - time.monotonic()))
            else:
                answer = wait.node.connect(wait.budget)
        except BaseException:
            _give_up(rounds, wait)  # interrupted (Ctrl-C)
            raise


def _wait_replies(wait: Replies) -> None:
    """Wait for each reply in turn, the masters that answered fastest lately first, so that a
    round decided by its quorum's replies does not sit waiting on a slower master's."""
    sent, enough = wait.sent, wait.enough
    if enough is not None and len(sent) > 1:
        sent = sorted(sent, key=lambda sent: sent[0].latency)
    needed = wait.needed
    fresh = True  # the first reply of a round cannot be there yet
    measured = False
    for pipe, slot in sent:
        if slot.reply is PENDING:
            pipe.wait(slot, wait.deadline, fresh=fresh)
            if not measured:
                # Only the first pipe waited for is timed: a later one's reply may have sat
                # unread while we waited for another (a sync pipe is read by whoever waits).
                # No reply yet: what it was waited for counts, so it is waited for last.
                pipe.took(time.monotonic() - slot.sent_at)
                measured = True
        fresh = False
        reply = slot.reply
        if type(reply) not in ANSWERS:  # (an answer is never a second try: looked at once)
            if second_try(slot):
                break
        elif enough is not None and enough(reply):
            needed -= 1
            if needed <= 0:
                break


def _decides(enough: Decides, slot: Slot) -> bool:
    reply = slot.reply
    return type(reply) in ANSWERS and enough(reply)


# --- asyncio ------------------------------------------------------------------------------------


async def arun(masters: Masters, procedure: Procedure[T]) -> T:
    """Perform a procedure's steps with asyncio (the twin of ``run``)."""
    answer: Any = None
    error: BaseException | None = None
    waiters: list[Waiter] = []
    try:
        while True:
            try:
                step = procedure.throw(error) if error else procedure.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            error = None
            try:
                if isinstance(step, Round) and step.cleanup:
                    answer = await asyncio.shield(_aperform(masters, step, waiters))
                else:
                    answer = await _aperform(masters, step, waiters)
            except BaseException as exc:  # noqa: BLE001 (handed to the procedure, re-raised there)
                error = exc
    finally:
        for waiter in waiters:
            masters.notices.unlisten(waiter)


async def _aperform(masters: Masters, step: Step, waiters: list[Waiter]) -> Any:
    if isinstance(step, Round):
        gate = masters.admission.of(asyncio.get_running_loop())
        await gate.enter(step.patience)
        try:
            return await afan_out(
                masters.nodes, step.command, masters.node_timeout, step.script, step.enough
            )
        finally:
            gate.leave()
    if isinstance(step, Pause):
        await asyncio.sleep(step.seconds)
        return None
    if isinstance(step, Listen):
        waiter = masters.notices.listen()
        waiters.append(waiter)
        await waiter.subscribed.await_(masters.node_timeout)
        return waiter
    if isinstance(step, AwaitTurn):
        return await step.turn.ready.await_(step.timeout)
    if isinstance(step, Detach):
        task = asyncio.get_running_loop().create_task(arun(masters, step.procedure))
        _DETACHED.add(task)  # a task only weakly referenced by its loop could be collected
        task.add_done_callback(_DETACHED.discard)
        return None
    assert isinstance(step, AwaitNotice)  # noqa: S101
    notified = await step.waiter.notified.await_(step.timeout)
    step.waiter.notified.clear()
    return notified


async def afan_out(
    nodes: Sequence[Node],
    command: Command,
    budget: float,
    script: Script | None = None,
    enough: Decides | None = None,
) -> RoundReplies:
    """One round (``rounds.exchange``) with asyncio waits, on the running loop's pipes."""
    loop = asyncio.get_running_loop()
    rounds = exchange(nodes, command, budget, lambda node: node.loop_pipe(loop), script, enough)
    answer: object = None
    while True:
        try:
            wait = rounds.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer = None
        try:
            if isinstance(wait, Replies):
                await _replies(loop, wait)
            elif isinstance(wait, Delay):  # (a Cluster shard's TRYAGAIN: detours)
                await asyncio.sleep(max(0.0, wait.until - time.monotonic()))
            else:
                answer = await wait.node.aconnect(loop, wait.budget)
        except BaseException:
            _give_up(rounds, wait)  # cancelled
            raise


#: Background procedures (``Detach``) still running on some event loop.
_DETACHED: set[asyncio.Task[Any]] = set()


def _give_up(rounds: Exchange, wait: Connect | Replies | Delay) -> None:
    """An interrupted round: replies still to come are dropped when they come (the pipes are
    shared: closing one would break every other round on it)."""
    if isinstance(wait, Replies):
        for pipe, slot in wait.sent:
            if slot.reply is PENDING:
                pipe.abandon(slot)
    rounds.close()


async def _replies(loop: asyncio.AbstractEventLoop, wait: Replies) -> None:
    """Until every slot has its reply (or its pipe broke), or the round is decided (``needed``
    more answers that ``enough`` accepts), or the deadline."""
    sent, deadline, enough = wait.sent, wait.deadline, wait.enough
    waiting = [slot for _, slot in sent if slot.reply is PENDING]
    if not waiting or any(second_try(slot) for _, slot in sent):
        return
    needed = wait.needed
    if enough is not None:
        needed -= sum(_decides(enough, slot) for _, slot in sent)
        if needed <= 0:
            return
    done = loop.create_future()
    left = len(waiting)

    def came(slot: Slot) -> None:
        nonlocal left, needed
        left -= 1
        if enough is not None and _decides(enough, slot):
            needed -= 1
        if (not left or needed <= 0 or second_try(slot)) and not done.done():
            done.set_result(None)

    for slot in waiting:
        slot.on_reply = came
    timer = loop.call_at(loop.time() + max(deadline - time.monotonic(), 0.0), _settle, done)
    try:
        await done
    finally:
        timer.cancel()
        for slot in waiting:
            slot.on_reply = None


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
