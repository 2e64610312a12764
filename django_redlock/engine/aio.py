"""The async twin: the same procedures as ``lock.py``, performed on ``redis.asyncio`` connections.

Every master is asked concurrently (one task each) under one common deadline, like the sync
fan-out. Connections belong to the event loop that made them, so idle ones are pooled per loop.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import redis
import redis.asyncio
import redis.asyncio.connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from .lock import Listen, Pause, Procedure, Round, Step
from .nodes import LAST_LOOK, Command, Node, Reply, Requests, failure, lock_connection_kwargs
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
_keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncIterator[None]] = (
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
        return await afan_out(redlock.nodes, step.command, redlock.node_timeout, step.script)
    if isinstance(step, Pause):
        await asyncio.sleep(step.seconds)
        return None
    if isinstance(step, Listen):
        waiter = redlock.notices.listen()
        waiters.append(waiter)
        await waiter.subscribed.await_(redlock.node_timeout)
        return waiter
    notified = await step.beacon.await_(step.timeout)
    step.beacon.clear()
    return notified


async def afan_out(
    nodes: Sequence[Node],
    command: Command,
    budget: float,
    script: Script | None = None,
) -> list[Reply]:
    """Async ``nodes.fan_out``: write every request, then read every reply, by one deadline
    ``budget`` seconds away.

    No task per master, and one timeout scope for all the reads rather than one per master:
    writes to open connections do not wait, and reading the replies in turn under one deadline
    costs the slowest master's time either way. (Each scope and each task costs tens of
    microseconds, more than a loopback round trip.)"""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + budget
    requests = Requests(command, script)
    pool = await _pool_of_this_loop()  # looked up once per round, not per master
    replies: list[Reply] = [None] * len(nodes)
    pending: list[tuple[int, AsyncConnection]] = []
    connecting: AsyncConnection | None = None
    try:
        unconnected = []
        for i, node in enumerate(nodes):
            idle = pool.get(node)
            conn = idle.pop() if idle else None
            if conn is None:
                unconnected.append(i)
                continue
            try:
                await conn.send_packed_command(requests.for_node(node), check_health=False)
            except (redis.RedisError, OSError) as exc:
                replies[i] = await _drop(node, conn, exc)
            else:
                pending.append((i, conn))
        for i in unconnected:
            try:
                async with asyncio.timeout_at(deadline):
                    connecting = _new_connection(nodes[i])
                    await connecting.connect()
                    await connecting.send_packed_command(
                        requests.for_node(nodes[i]), check_health=False
                    )
            except (redis.RedisError, OSError, TimeoutError) as exc:
                replies[i] = await _drop(nodes[i], connecting, exc)
            else:
                pending.append((i, connecting))
            connecting = None
        while pending:
            try:
                async with asyncio.timeout_at(deadline):
                    while pending:
                        i, conn = pending[0]
                        node = nodes[i]
                        reply = await _read(conn)
                        if requests.forgot_script(node, reply):
                            await conn.send_packed_command(
                                requests.with_source(), check_health=False
                            )
                            reply = await _read(conn)
                        pending.pop(0)
                        pool.setdefault(node, []).append(conn)
                        if isinstance(reply, redis.ResponseError):
                            reply = failure(node, reply)
                        else:
                            requests.answered(node)
                        replies[i] = reply
            except (redis.RedisError, OSError, TimeoutError) as exc:
                i, conn = pending.pop(0)
                replies[i] = await _drop(nodes[i], conn, exc)
                # Past the deadline, the others get a last look only: a reply already buffered
                # still counts, but we no longer wait for one.
                deadline = max(deadline, loop.time() + LAST_LOOK)
    except BaseException:
        # Cancelled mid-round: replies may still arrive on every connection not yet read, and
        # one may be half connected; none may be read later as the answer to another request.
        for conn in [c for _, c in pending] + ([connecting] if connecting else []):
            await asyncio.shield(conn.disconnect(nowait=True))
        raise
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


async def _close_with_the_loop(pool: dict[Node, list[AsyncConnection]]) -> AsyncIterator[None]:
    """Parked at its ``yield`` for the loop's lifetime: ``asyncio.run`` (and any loop shutdown
    that calls ``shutdown_asyncgens``) closes it, and with it our idle connections, while the loop
    can still run their clean-up."""
    try:
        yield
    finally:
        idle = [conn for conns in pool.values() for conn in conns]
        pool.clear()
        for conn in idle:
            await conn.disconnect(nowait=True)


async def _pool_of_this_loop() -> dict[Node, list[AsyncConnection]]:
    loop = asyncio.get_running_loop()
    pool = _idle.get(loop)
    if pool is None:
        pool = _idle[loop] = {}
        keeper = _close_with_the_loop(pool)
        await keeper.__anext__()
        _keepers[loop] = keeper  # held, or it would be finalized (and close the pool) at once
    return pool


def _new_connection(node: Node) -> AsyncConnection:
    kwargs = lock_connection_kwargs(node.spec, node.timeout)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    # No per-call socket timeout: redis.asyncio would wrap every send and read in wait_for (a
    # task each). The round's own deadline bounds every await instead.
    kwargs["socket_timeout"] = None
    conn_class = _ASYNC_CLASS.get(node.spec.connection_class, redis.asyncio.connection.Connection)
    return conn_class(**kwargs)
