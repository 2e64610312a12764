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

from .lock import Listen, Pause, Procedure, Round
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
    """Perform a procedure's steps with asyncio."""
    answer: Any = None
    waiters: list[Waiter] = []
    try:
        while True:
            try:
                step = procedure.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if isinstance(step, Round):
                nodes, budget = redlock.nodes, redlock.node_timeout
                answer = await afan_out(nodes, step.commands, budget, step.script)
            elif isinstance(step, Pause):
                await asyncio.sleep(step.seconds)
                answer = None
            elif isinstance(step, Listen):
                answer = redlock.notices.listen(step.channel)
                waiters.append(answer)
                await answer.subscribed.await_(redlock.node_timeout)
            else:
                answer = await step.waiter.notified.await_(step.timeout)
                step.waiter.notified.clear()
    finally:
        for waiter in waiters:
            redlock.notices.unlisten(waiter)


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
