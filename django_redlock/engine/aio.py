"""The async twin: the same procedures as ``lock.py``, and the same rounds (``nodes.exchange``) on
the same pooled connections, performed with asyncio waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .lock import Listen, Pause, Procedure, Round, Step
from .nodes import Command, Connect, Node, Readable, Reply, Wire, connect, exchange
from .notices import Waiter
from .scripts import Script

if TYPE_CHECKING:
    from .client import Redlock

T = TypeVar("T")


async def arun(redlock: Redlock, procedure: Procedure[T]) -> T:
    """Perform a procedure's steps with asyncio (the twin of ``lock.run``: an interrupted step
    is thrown into the procedure, whose clean-up steps run shielded from cancellation)."""
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
                    answer = await asyncio.shield(_perform(redlock, step, waiters))
                else:
                    answer = await _perform(redlock, step, waiters)
            except BaseException as exc:  # noqa: BLE001 (handed to the procedure, re-raised there)
                error = exc
    finally:
        for waiter in waiters:
            redlock.notices.unlisten(waiter)


async def _perform(redlock: Redlock, step: Step, waiters: list[Waiter]) -> Any:
    if isinstance(step, Round):
        return await afan_out(redlock.nodes, step.command, redlock.node_timeout, step.script)
    if isinstance(step, Pause):
        await asyncio.sleep(step.seconds)
        return None
    if isinstance(step, Listen):
        waiter = redlock.notices.listen()
        waiters.append(waiter)
        await waiter.subscribed.await_(redlock.node_timeout)
        return waiter
    notified = await step.waiter.notified.await_(step.timeout)
    step.waiter.notified.clear()
    return notified


async def afan_out(
    nodes: Sequence[Node],
    command: Command,
    budget: float,
    script: Script | None = None,
) -> list[Reply]:
    """``nodes.exchange`` with asyncio waits, on the same pooled connections as the sync engine.
    The round's work is plain non-blocking socket calls; the event loop watches a socket only
    while its master has not answered yet. (A task or a timeout scope per master costs tens of
    microseconds, more than a loopback round trip.)"""
    loop = asyncio.get_running_loop()
    rounds = exchange(nodes, command, budget, script)
    answer: object = None
    while True:
        try:
            wait = rounds.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            if isinstance(wait, Readable):
                await _readable(loop, wait.wire, wait.timeout)
                answer = None
            else:
                answer = await _connect(loop, wait)
        except BaseException:
            rounds.close()  # cancelled: drop the connections still awaited
            raise


async def _readable(loop: asyncio.AbstractEventLoop, wire: Wire, timeout: float) -> None:
    """Until ``wire`` has data (or is closed), at most ``timeout`` seconds."""
    ready = loop.create_future()
    fd = wire.fileno()
    try:
        loop.add_reader(fd, _settle, ready)
    except NotImplementedError:  # a loop without readers (Windows' proactor): wait in a thread
        await loop.run_in_executor(None, wire.wait_readable, timeout)
        return
    timer = loop.call_later(timeout, _settle, ready)
    try:
        await ready
    finally:
        timer.cancel()
        loop.remove_reader(fd)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _connect(loop: asyncio.AbstractEventLoop, wait: Connect) -> Wire | Exception:
    """A new connection, made in a thread (name resolution and the handshake block, and the
    event loop must not), awaited no longer than the round's deadline."""
    made = loop.run_in_executor(None, connect, wait)
    try:
        return await asyncio.wait_for(
            asyncio.shield(made), max(wait.deadline - time.monotonic(), 0.0)
        )
    except TimeoutError:
        made.add_done_callback(_close_unused)  # too late: close what the thread still makes
        return TimeoutError("no connection within the node budget")
    except BaseException:
        made.add_done_callback(_close_unused)  # interrupted: close what the thread still makes
        raise


def _close_unused(made: asyncio.Future[Wire | Exception]) -> None:
    if not made.cancelled() and isinstance(wire := made.result(), Wire):
        wire.close()
