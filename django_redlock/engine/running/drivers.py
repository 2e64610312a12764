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
from collections.abc import Coroutine, Sequence
from operator import methodcaller
from typing import Any, TypeVar

from ..algorithm.steps import (
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
from ..base import deadlines
from ..members.connections import Node
from ..members.detours import Delay
from ..members.packing import Command
from ..members.pipes import Pipe
from ..members.rounds import (
    Connect,
    Decides,
    Exchange,
    Replies,
    RoundReplies,
    exchange,
    second_try,
)
from ..members.slots import ANSWERS, PENDING, Slot
from ..members.unawaited import abandon_waiting
from ..scripts.plain import Script
from ..waiting.admission import Full, holder_patience
from ..waiting.waiter import Waiter

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
        gate.enter(step.patience, step.behind)
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
        masters.watchdog.ready()
        waiter = masters.notices.listen()
        waiters.append(waiter)
        masters.notices.wait(waiter.subscribed, masters.node_timeout, settle=True)
        return waiter
    if isinstance(step, AwaitTurn):
        return step.turn.ready.wait(step.timeout)
    if isinstance(step, Detach):
        threading.Thread(target=run, args=(masters, step.procedure), daemon=True).start()
        return None
    notified = masters.notices.wait_notice(step.waiter, step.timeout, masters.node_timeout)
    step.waiter.notified.clear()
    return notified


def fan_out(
    nodes: Sequence[Node],
    command: Command,
    budget: float,
    script: Script | None = None,
    enough: Decides | None = None,
) -> RoundReplies:
    """One round (``rounds.exchange``) with blocking waits, on the threads' pipes."""
    # (None: the threads' pipes; its waits for replies are made in place: ``_wait_replies``.)
    rounds = exchange(nodes, command, budget, None, script, enough, _wait_replies)
    answer: object = None
    while True:
        try:
            wait = rounds.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        answer = None
        try:
            if isinstance(wait, Replies):  # (a second try's: ``rounds._ask``)
                _wait_replies(wait.sent, wait.deadline, wait.enough)
            elif isinstance(wait, Delay):  # (a Cluster shard's TRYAGAIN: detours)
                time.sleep(max(0.0, wait.until - time.monotonic()))
            else:
                answer = wait.node.connect(wait.budget)
        except BaseException:
            _give_up(rounds, wait)  # interrupted (Ctrl-C)
            raise


def _wait_replies(sent: list[tuple[Pipe, Slot]], deadline: float, enough: Decides | None) -> None:
    """A thread's round waits here for its replies (``rounds.WaitHere``).

    With ``enough`` (a round a quorum decides), for one reply only: on the master that answered
    fastest lately, so that the round does not sit waiting on a slower master's while the others
    could decide it. The replies that came meanwhile are then read without waiting (a round's
    replies mostly come together). The round tallies them and, while undecided, waits again
    here for the rest: one tally (``exchange``'s), and no order to sort the round's pipes in.
    Without it, for every reply in turn (until one asks for a second try)."""
    if enough is None:
        fresh = True  # (as below)
        for pipe, slot in sent:
            if slot.reply is PENDING:
                pipe.wait(slot, deadline, fresh=fresh)
                if fresh:
                    pipe.took(time.monotonic() - slot.sent_at)  # (as below)
                if second_try(slot):
                    break
            fresh = False
        return
    # (A loop, not min(key=): saves 7.9k instructions a cycle, 1.9%; kept for issue 37's budget.)
    first = sent[0]
    fastest = first[0].latency
    for each in sent:
        if each[0].latency < fastest:
            first, fastest = each, each[0].latency
    pipe, slot = first
    if slot.reply is PENDING:
        # (fresh: its request mostly just left, its reply cannot be there yet; if it is, the
        # poll finds it at once)
        pipe.wait(slot, deadline, fresh=True)
        # Only the pipe waited for is timed: another's reply may have sat unread meanwhile (a
        # sync pipe is read by whoever waits). No reply yet: what it was waited for counts, so
        # it is waited for last.
        pipe.took(time.monotonic() - slot.sent_at)
    for pipe, slot in sent:
        if slot.reply is PENDING:
            pipe.try_pump()


def _decides(enough: Decides, slot: Slot) -> bool:
    reply = slot.reply
    return type(reply) in ANSWERS and enough(reply)


# --- asyncio ------------------------------------------------------------------------------------


async def arun(
    masters: Masters,
    procedure: Procedure[T],
    *,
    shielded: bool = False,
    holder_until: float | None = None,
) -> T:
    """Perform a procedure's steps with asyncio (the twin of ``run``), its rounds in this same
    coroutine: a round's turn among this loop's rounds (``admission``: a bare future, awaited
    only when none is free), then ``rounds.exchange`` with asyncio waits on the loop's pipes. In
    a burst every coroutine costs its making, a pass at each resumption, and the collector's look
    at each one a queued round keeps. ``shielded``: a clean-up round's own run (``afan_out``).

    ``holder_until``: the first step is the round of a holder whose lease is valid until then.
    Its turn (``holder_patience``) is taken before the procedure begins: a release is made once
    its turn came, after the acquisitions queued before it, not among what they wait behind (nor
    what the collector goes through meanwhile). Whatever ends that wait early (a cancellation)
    is thrown into the procedure at its first step, as it would have been there."""
    answer: Any = None
    error: BaseException | None = None
    waiters: list[Waiter] | None = None  # (made by the first step that is not a round)
    loop: asyncio.AbstractEventLoop | None = None
    admitted = False  # a turn taken for the first step (``holder_until``)
    if holder_until is not None:
        loop = asyncio.get_running_loop()
        gate = masters.admission.of(loop)
        admitted = gate.enter_at_once()
        if not admitted:
            place = gate.queue(None, holder_patience(holder_until))
            try:
                await place[1]
                admitted = True
            except BaseException as interrupted:  # noqa: BLE001 (thrown in at the first step)
                gate.gave_up(place)
                error = interrupted
                try:
                    procedure.send(None)  # (its first step, interrupted: thrown in below)
                except StopIteration:
                    raise interrupted from None
    try:
        while True:
            try:
                step = procedure.throw(error) if error else procedure.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            error = None
            if admitted and (not isinstance(step, Round) or step.cleanup):
                admitted = False  # (not a round of its own: the turn goes to the next one)
                masters.admission.of(asyncio.get_running_loop()).leave()
            try:
                if not isinstance(step, Round):
                    if waiters is None:
                        waiters = []
                    answer = await _aperform(masters, step, waiters)
                    continue
                if step.cleanup and not shielded:
                    answer = await asyncio.shield(afan_out(masters, step))
                    continue
                if loop is None:
                    loop = asyncio.get_running_loop()
                gate = masters.admission.of(loop)
                if admitted:
                    admitted = False  # its turn, taken before it began
                elif not gate.enter_at_once():
                    place = gate.queue(step.patience, step.behind)
                    try:
                        await place[1]
                    except Full:
                        raise gate.refused(place) from None
                    except BaseException:
                        gate.gave_up(place)
                        raise
                try:
                    nodes, budget = masters.nodes, masters.node_timeout
                    rounds = exchange(
                        nodes, step.command, budget, methodcaller("loop_pipe", loop),
                        step.script, step.enough,
                    )  # fmt: skip
                    came_back: object = None
                    while True:
                        try:
                            wait = rounds.send(came_back)
                        except StopIteration as done:
                            answer = done.value
                            break
                        came_back = None
                        try:
                            if isinstance(wait, Replies):
                                came = _Came.waiting(loop, wait)
                                if came is not None:
                                    try:
                                        await came.done
                                    finally:
                                        came.detach()
                            elif isinstance(wait, Delay):  # (a Cluster shard's TRYAGAIN: detours)
                                await asyncio.sleep(max(0.0, wait.until - time.monotonic()))
                            else:
                                came_back = await wait.node.aconnect(loop, wait.budget)
                        except BaseException:
                            _give_up(rounds, wait)  # cancelled
                            raise
                finally:
                    gate.leave()
            except BaseException as exc:  # noqa: BLE001 (handed to the procedure, re-raised there)
                error = exc
    finally:
        if admitted:  # (it ended before its first step: the turn goes to the next round)
            masters.admission.of(asyncio.get_running_loop()).leave()
        if waiters:
            for waiter in waiters:
                masters.notices.unlisten(waiter)


def _only(step: Round) -> Procedure[RoundReplies]:
    replies: RoundReplies = yield step
    return replies


def afan_out(masters: Masters, step: Round) -> Coroutine[Any, Any, RoundReplies]:
    """One round in a coroutine of its own (a clean-up round's, shielded: see ``arun``)."""
    return arun(masters, _only(step), shielded=True)


async def _aperform(masters: Masters, step: Step, waiters: list[Waiter]) -> Any:
    """Any step but a round (``arun``)."""
    if isinstance(step, Pause):
        await asyncio.sleep(step.seconds)
        return None
    if isinstance(step, Listen):
        masters.watchdog.ready()  # (a thread start: as the sync driver's)
        waiter = masters.notices.listen(asynchronous=True)
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


#: Background procedures (``Detach``) still running on some event loop.
_DETACHED: set[asyncio.Task[Any]] = set()


def _give_up(rounds: Exchange, wait: Connect | Replies | Delay) -> None:
    """An interrupted round: its replies still to come are dropped (``abandon_waiting``)."""
    if isinstance(wait, Replies):
        abandon_waiting(wait.sent)
    rounds.close()


class _Came:
    """What an async round waits for: ``done`` once every slot has its reply (or its pipe broke),
    or the round is decided (``needed`` more answers that ``enough`` accepts), or the deadline
    passed (one timer per loop for every round: ``deadlines``). Each slot's pipe calls it with
    the slot when the reply comes: one object per round, no closure, no timer of its own."""

    __slots__ = ("done", "enough", "left", "needed", "slots")

    def __init__(
        self, done: asyncio.Future[None], slots: list[Slot], needed: int, enough: Decides | None
    ) -> None:
        self.done = done
        self.slots = slots
        self.left = len(slots)
        self.needed = needed
        self.enough = enough

    @classmethod
    def waiting(cls, loop: asyncio.AbstractEventLoop, wait: Replies) -> _Came | None:
        """The wait for ``wait``'s replies; None if there is nothing to wait for."""
        sent, enough, needed = wait.sent, wait.enough, wait.needed
        slots = [slot for _, slot in sent if slot.reply is PENDING]
        if len(slots) < len(sent):  # (a round's later wait: some answered already)
            if not slots or any(second_try(slot) for _, slot in sent):
                return None
            if enough is not None:
                needed -= sum(_decides(enough, slot) for _, slot in sent)
                if needed <= 0:
                    return None
        came = cls(loop.create_future(), slots, needed, enough)
        for slot in slots:
            slot.on_reply = came
        deadlines.of(loop).call_at(wait.deadline, deadlines.settle, came.done)
        return came

    def __call__(self, slot: Slot) -> None:
        done = self.done
        if done.done():  # (decided: the rest of its replies, read in the same pass)
            return
        self.left -= 1
        reply = slot.reply
        if type(reply) in ANSWERS:
            if self.enough is not None and self.enough(reply):
                self.needed -= 1
        elif second_try(slot):
            done.set_result(None)  # back at once: the second try needs the budget
            return
        if not self.left or self.needed <= 0:
            done.set_result(None)

    def detach(self) -> None:
        for slot in self.slots:
            slot.on_reply = None
