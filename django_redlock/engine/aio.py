"""The async twin: the same procedures as ``lock.py``, performed on ``redis.asyncio`` connections.

Every master is asked concurrently (one task each) under one common deadline, like the sync
fan-out. Connections belong to the event loop that made them, so idle ones are pooled per loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from .lock import Listen, Pause, Procedure, Round, Step
from .nodes import Command, Node, Reply, failure, lock_connection_kwargs
from .notices import Waiter
from .scripts import Script

if TYPE_CHECKING:
    from .client import Redlock

T = TypeVar("T")

_ASYNC_CLASS: dict[type[Any], type[redis.asyncio.connection.AbstractConnection]] = {
    redis.connection.Connection: redis.asyncio.connection.Connection,
    redis.connection.SSLConnection: redis.asyncio.connection.SSLConnection,
    redis.connection.UnixDomainSocketConnection: (
        redis.asyncio.connection.UnixDomainSocketConnection
    ),
}

AsyncConnection = redis.asyncio.connection.AbstractConnection

# event loop -> node -> idle connections made on that loop
_idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Node, list[AsyncConnection]]] = (
    weakref.WeakKeyDictionary()
)


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
        return await afan_out(redlock.nodes, step.commands, redlock.node_timeout, step.script)
    if isinstance(step, Pause):
        await asyncio.sleep(step.seconds)
        return None
    if isinstance(step, Listen):
        waiter = redlock.notices.listen(step.channel)
        waiters.append(waiter)
        await waiter.subscribed.await_(redlock.node_timeout)
        return waiter
    notified = await step.waiter.notified.await_(step.timeout)
    step.waiter.notified.clear()
    return notified


async def afan_out(
    nodes: Sequence[Node],
    commands: Sequence[Command],
    budget: float,
    script: Script | None = None,
) -> list[Reply]:
    """Async ``nodes.fan_out``: write every request, then read every reply, by one deadline
    ``budget`` seconds away. (No task per master: writes do not wait, and reads in turn under one
    deadline cost the slowest master's time, as tasks would, for a fraction of the overhead.)"""
    deadline = asyncio.get_running_loop().time() + budget
    replies: list[Reply] = [None] * len(nodes)
    in_flight: list[tuple[int, AsyncConnection]] = []
    for i, node in enumerate(nodes):
        conn = None
        try:
            async with asyncio.timeout_at(deadline):
                conn = await _checkout(node)
                await conn.send_packed_command(conn.pack_command(*commands[i]), check_health=False)
        except (redis.RedisError, OSError, TimeoutError) as exc:
            replies[i] = await _drop(node, conn, exc)
        else:
            in_flight.append((i, conn))
    for n, (i, conn) in enumerate(in_flight):
        try:
            async with asyncio.timeout_at(deadline):
                reply = await _read(conn)
                if isinstance(reply, NoScriptError) and script is not None:
                    # A flushed or restarted master forgot the script: send its source.
                    command = ("EVAL", script.source, *commands[i][2:])
                    await conn.send_packed_command(conn.pack_command(*command), check_health=False)
                    reply = await _read(conn)
        except (redis.RedisError, OSError, TimeoutError) as exc:
            replies[i] = await _drop(nodes[i], conn, exc)
            continue
        except BaseException:
            # Cancelled mid-round: replies may still arrive on every unread connection; none of
            # them may be read later as the answer to another request.
            for _, unread in in_flight[n:]:
                await asyncio.shield(unread.disconnect(nowait=True))
            raise
        _checkin(nodes[i], conn)
        replies[i] = failure(nodes[i], reply) if isinstance(reply, redis.ResponseError) else reply
    return replies


async def _read(conn: AsyncConnection) -> Reply:
    try:
        return await conn.read_response()
    except redis.ResponseError as exc:  # an error reply: the connection itself is fine
        return exc


async def _drop(node: Node, conn: AsyncConnection | None, exc: BaseException) -> Reply:
    if conn is not None:
        # A reply may still be on its way: never let a later request read it as its own.
        await conn.disconnect(nowait=True)
    return failure(node, exc)


async def _checkout(node: Node) -> AsyncConnection:
    idle = _idle.setdefault(asyncio.get_running_loop(), {}).get(node)
    if idle:
        return idle.pop()
    kwargs = lock_connection_kwargs(node.spec, node.timeout)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    conn = _ASYNC_CLASS.get(node.spec.connection_class, redis.asyncio.connection.Connection)(
        **kwargs
    )
    await conn.connect()
    return conn


def _checkin(node: Node, conn: AsyncConnection) -> None:
    _idle.setdefault(asyncio.get_running_loop(), {}).setdefault(node, []).append(conn)
