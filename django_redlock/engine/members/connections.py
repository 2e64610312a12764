"""One master: where it is (URL checks, ``NodeSpec``), its per-request budget, and its pipelined
connections: one for the process's threads and one per event loop (see ``pipes``), each made once
and awaited by every round that needs it meanwhile.

Why our own connections instead of ``redis.Redis``: a lock round must write one request to every
master before reading any reply (N masters cost one round trip, not N), and concurrent rounds must
share a connection instead of each taking one from a pool that grows with the callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import redis

from ..base import protocol
from ..base.loops import of_loop
from . import acks, cluster, dialing, sentinel
from .dialing import Connected
from .incarnations import Incarnation
from .pipes import Flusher, Pipe
from .quarantine import Watch, read_identity
from .scripting import Scripting
from .urls import check_url, cluster_identity, mask_url, sentinel_identity

#: How much longer than its budget a thread waits for a connect another thread is making.
CONNECT_GRACE = 0.05


@dataclass(frozen=True)
class NodeSpec:
    """Where one master is and how to talk to it, before any connection exists.

    ``label`` is safe to show (no password). ``connection_class``/``connection_kwargs`` are
    redis-py's: it opens every connection of ours (TLS, AUTH, SELECT), sync and async alike.
    """

    label: str
    connection_class: type[redis.connection.AbstractConnection]
    #: (Not in its repr: it holds the password.)
    connection_kwargs: Mapping[str, Any] = field(repr=False)
    #: A Sentinel-managed primary: its connections find it through Sentinel (see ``sentinel``).
    service: sentinel.Service | None = None
    #: A Redis Cluster: the nodes its URL names (see ``cluster`` and ``shards``).
    seeds: cluster.Seeds | None = None
    #: Its votes count only once its replicas acknowledged them (``?wait_replicas=``: ``acks``).
    ack: acks.ReplicaAck | None = None

    @classmethod
    def from_url(cls, url: str) -> NodeSpec:
        label = mask_url(check_url(url))
        if cluster.is_cluster_url(url):  # (check_url refused our options on it)
            seeds, plain = cluster.parse(url, label)
            pool = redis.ConnectionPool.from_url(plain)
            kwargs = dict(pool.connection_kwargs)
            return cls(label, pool.connection_class, kwargs, seeds=seeds)
        url, ack = acks.parse(url, label)
        if sentinel.is_sentinel_url(url):
            service, plain = sentinel.parse(url, label)
            pool = redis.ConnectionPool.from_url(plain)
            connection_class = sentinel.sentinel_connection(pool.connection_class, service)
            return cls(label, connection_class, dict(pool.connection_kwargs), service, ack=ack)
        pool = redis.ConnectionPool.from_url(url)
        return cls(label, pool.connection_class, dict(pool.connection_kwargs), ack=ack)

    @classmethod
    def from_pool(cls, label: str, pool: redis.ConnectionPool) -> NodeSpec:
        """Reuse an existing pool's settings (a django-redis cache) without sharing its sockets."""
        return cls(label, pool.connection_class, dict(pool.connection_kwargs))

    @property
    def identity(self) -> tuple[str, ...]:
        """Which redis-server this is, whatever the spelling: host and port (or socket path),
        loopback however written, not the db number. Two entries with one identity are one
        failure domain and must not vote twice. (Other names are compared as written: no DNS
        lookup at configuration time.) A Sentinel member: its service name and Sentinels. A
        Cluster member: its seeds."""
        if self.seeds is not None:
            return cluster_identity(self.seeds)
        if self.service is not None:
            return sentinel_identity(self.service)
        return protocol.server_identity(self.connection_kwargs)


class Node:
    """One master: its spec, budget, and the pipes of this process to it."""

    def __init__(self, spec: NodeSpec, timeout: float, *, max_ttl: float | None = None) -> None:
        self.spec = spec
        self.label = spec.label
        self.timeout = timeout
        self._kwargs = dialing.lock_connection_kwargs(spec.connection_kwargs, timeout)
        #: SHAs of scripts this master ran for us go as EVALSHA, others with their source: a slow
        #: master is never left with a request it cannot run (a late NOSCRIPT is read by no one).
        self.warm: set[str] = set()
        #: Monotonic time until which rounds leave this master out (see rounds.SKIP_SILENT_FOR).
        self.silent_until = 0.0
        #: Restart and failover quarantine (``quarantine``), when on: abstains up to ``max_ttl``.
        self.watch: Watch | None = None if max_ttl is None else Watch(max_ttl)
        #: The server process our connections reach (``incarnations``): a restart, seen.
        self.server = Incarnation(asks=self.watch is None)
        #: Replica acknowledgement of its grants (``acks``), when its URL asks for it.
        self.acks = None if spec.ack is None else acks.Acks(spec.ack, timeout, self.label)
        #: Routed, watched or acknowledged: a round looks into each of those (else it writes its
        #: request straight away: ``rounds.exchange``).
        self.unusual = self.routed or self.watch is not None or self.acks is not None
        #: Whether it can run our Lua scripts (``scripting``; ``unusual`` while not sure).
        self.scripting = Scripting(self)
        self._forget()
        _ALL_NODES.add(self)

    def _forget(self) -> None:
        """No pipes (a new node, or a forked child: it must not read replies meant for its parent
        on shared sockets, nor close them, as redis-py does not); a guard no parent thread holds."""
        self._guard = threading.Lock()
        #: The threads' pipe, and the connect in progress for it (shared by every waiting round).
        self.pipe: Pipe | None = None
        self._connecting: _Connecting | None = None
        #: Per event loop: its pipe, and the connect in progress for it.
        self._loop_pipes: dict[asyncio.AbstractEventLoop, Pipe] = {}
        self._loop_connecting: dict[asyncio.AbstractEventLoop, _Attempt] = {}
        self._last: Pipe | None = None  # the last loop pipe used: the usual one, found at once
        self.scripting.forget()  # (a forked child's: its probes were the parent's)

    def __repr__(self) -> str:
        return f"<Node {self.label}>"

    def route(self, command: tuple[Any, ...]) -> Node:
        """The node a round sends ``command`` to for this member: itself (a Cluster member: the
        shard that owns the command's slot, see ``shards``)."""
        return self

    redirects = routed = False  # (a Cluster shard redirects: ``detours``; a member: ``route``)

    def redirected(self, error: redis.ResponseError) -> Node | None:
        """Where a ``MOVED``/``ASK`` reply sends the request (a Cluster shard); None here."""
        return None

    # --- the threads' pipe ---------------------------------------------------------------------

    def connect(self, budget: float) -> Pipe | Exception:
        """The threads' pipe, connecting it if needed (within ``budget``): once, whoever asks
        first; every other thread that needs it meanwhile waits for that attempt."""
        with self._guard:
            pipe = self.pipe
            if pipe is not None and not pipe.closed:
                return pipe
            connecting = self._connecting
            mine = connecting is None
            if connecting is None:
                connecting = self._connecting = _Connecting()
        if not mine:
            if not connecting.done.wait(budget + CONNECT_GRACE):
                return TimeoutError("no connection within the node budget")
            return connecting.result
        try:
            result: Pipe | Exception = self.scripting.probe(
                self.server.piped(self._open(budget), Pipe)
            )
        except (redis.RedisError, OSError) as exc:
            result = exc
        with self._guard:
            if isinstance(result, Pipe):
                self.pipe = result
            self._connecting = None
        connecting.result = result
        connecting.done.set()
        return result

    # --- a loop's pipe -----------------------------------------------------------------------

    def loop_pipe(self, loop: asyncio.AbstractEventLoop) -> Pipe | None:
        """This loop's open pipe, if it has one (no I/O)."""
        pipe = self._last
        if pipe is not None and pipe.loop is loop and not pipe.closed:
            return pipe
        pipe = self._loop_pipes.get(loop)
        if pipe is not None and not pipe.closed:
            self._last = pipe
            return pipe
        return None

    async def aconnect(self, loop: asyncio.AbstractEventLoop, budget: float) -> Pipe | Exception:
        """This loop's pipe, connecting it if needed (within ``budget``): once per loop, and
        every round that needs it meanwhile awaits that attempt: on the loop (``dialing``), or
        where a handshake may block (name lookup, TLS, Sentinel) on a small thread pool of ours."""
        pipe = self.loop_pipe(loop)
        if pipe is not None:
            return pipe
        connecting = self._loop_connecting.get(loop)
        if connecting is None:
            self._sweep_closed_loops()
            attempt = connecting = _Attempt(None, loop.create_future())
            self._loop_connecting[loop] = attempt
            address = self._address
            if address is not None:
                attempt.made = dialing.connect(loop, address, budget, self._dialed)
                attempt.made.add_done_callback(lambda _: self._opened(loop, attempt))
            else:
                attempt.made = dialing.connect_pool().submit(self._open, budget)
                attempt.made.add_done_callback(
                    lambda _: dialing.hand_over(loop, lambda: self._opened(loop, attempt))
                )
        if connecting.made is not None and connecting.made.done():
            # Made already (or at once), callback not run yet: use it now, not a loop pass later.
            self._opened(loop, connecting)
        # No timer of our own: the attempt is bounded by its budget (socket timeouts; on the loop,
        # ``dialing`` asks the socket before it blames the master for a busy loop's lateness).
        try:
            if connecting.pipe.done():
                return connecting.pipe.result()
            return await asyncio.shield(connecting.pipe)
        except (redis.RedisError, OSError) as exc:
            return exc

    def _opened(self, loop: asyncio.AbstractEventLoop, connecting: _Attempt) -> None:
        """The connect ended (in our thread pool, or on the loop): make the loop's pipe of it. A
        failed one stays the loop's attempt for the rest of this loop pass, shared by every
        round of a burst (each made its own before: with one master down, a thousand a pass)."""
        made, connecting.made = connecting.made, None  # (and no cycle through its callback)
        if made is None or connecting.pipe.done():
            return
        if self._loop_connecting.get(loop) is connecting:
            del self._loop_connecting[loop]
        try:
            if loop.is_closed():
                _discard(made)
                raise redis.ConnectionError("the event loop closed while connecting")
            if made.cancelled():  # (a connect on a loop that is shutting down)
                raise redis.ConnectionError("the connect was cancelled")
            made_pipe = self.server.piped(made.result(), lambda c: Pipe(c, loop, _flusher_of(loop)))
            pipe = self.scripting.probe(made_pipe)
        except (redis.RedisError, OSError) as exc:
            connecting.pipe.set_exception(exc)
            connecting.pipe.exception()  # retrieved: a round that gave up waiting must not warn
            if not loop.is_closed():  # (shared until the next pass: see above)
                self._loop_connecting[loop] = connecting
                loop.call_soon(self._loop_connecting.pop, loop, None)
            return
        self._loop_pipes[loop] = self._last = pipe
        connecting.pipe.set_result(pipe)

    def _sweep_closed_loops(self) -> None:
        for loop in [loop for loop in self._loop_pipes if loop.is_closed()]:
            self._loop_pipes.pop(loop).close()

    # --- both --------------------------------------------------------------------------------

    @functools.cached_property
    def _address(self) -> dialing.Address | None:
        """How a connection here is made without redis-py's connect (a loop's on the loop, a
        thread's with a plain socket), if it can be (see ``dialing``)."""
        own_open = type(self)._open is not Node._open  # noqa: SLF001 (a Cluster shard's)
        plain = self.spec.service is None and self.watch is None and not own_open
        return dialing.address_of(self.spec.connection_class, self._kwargs) if plain else None

    def _fresh(self, budget: float = 0.0) -> redis.connection.AbstractConnection:
        """A new redis-py connection here, not connected yet (scripts: see ``_open``)."""
        conn = self.spec.connection_class(**self._kwargs)
        conn.socket_connect_timeout = conn.socket_timeout = budget
        self.warm.clear()
        return conn

    def _dialed(self, budget: float = 0.0) -> dialing.Dialed:
        """What holds a new connection ``dialing`` made here (scripts: see ``_open``)."""
        self.warm.clear()
        return dialing.Dialed()

    def _open(self, budget: float) -> Connected:
        """A new connection, its connect and handshake (TLS, AUTH, SELECT) each bounded by
        ``budget``."""
        address = self._address
        if address is not None:  # (nothing below applies to a plain master)
            return dialing.dial(address, budget, self._dialed)
        conn = self._fresh(budget)
        conn.connect()
        # A new connection may reach a restarted server that forgot our scripts: send them with
        # their source again. A NOSCRIPT that came after a round returned at quorum would be read
        # by no one, and the request (a release, say) never applied there.
        self.warm.clear()
        if self.spec.service is not None:
            sentinel.follow_switches(self.spec.service, self)
        if self.watch is not None:
            self._identify(conn)
        return conn

    def _identify(self, conn: redis.connection.AbstractConnection) -> None:
        """Quarantine: read who the member is on its new connection (one round trip, before any
        round uses it) and let the watch judge it. A member that will not tell (INFO refused by
        an ACL or renamed) is judged as changed: we cannot know it did not restart."""
        assert self.watch is not None  # noqa: S101
        try:
            identity = read_identity(conn)
        except (redis.ResponseError, ValueError) as exc:
            self.watch.cannot_tell(f"{type(exc).__name__}: {exc}")
            return
        except (redis.RedisError, OSError):
            conn.disconnect()
            raise
        self.watch.judge(identity)
        self.server.saw(identity.run_id)

    def primary_moved(self) -> None:
        """A Sentinel member's primary moved (``+switch-master``, told on the Sentinel listener's
        thread): close our pipes to the old one, each on its own loop, so that the next round
        connects to the new one; requests in flight are asked again there."""
        moved = redis.ConnectionError("the primary moved (+switch-master)")
        with self._guard:
            pipe, loop_pipes = self.pipe, list(self._loop_pipes.values())
        if pipe is not None:
            pipe.close(moved)
        for each in loop_pipes:
            loop = each.loop
            if loop is not None and not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # (closed meanwhile)
                    loop.call_soon_threadsafe(each.close, moved)

    def close(self) -> None:
        with self._guard:
            pipe, self.pipe = self.pipe, None
            loop_pipes, self._loop_pipes = self._loop_pipes, {}
            attempts, self._loop_connecting = self._loop_connecting, {}
            self._last = None
        for each in [pipe, *loop_pipes.values()]:
            if each is not None:
                each.close()
        for attempt in attempts.values():  # connects still under way: what they make is closed
            if attempt.made is not None:
                attempt.made.add_done_callback(_discard)

    def subscriber(self) -> Connected:
        """A new connection for our release-notice inbox (``inboxes``), connected with the lock
        path's settings (RESP2, no retries, this node's budget), leaving the lock path's alone."""
        address = self._address
        if address is not None:
            return dialing.dial(address, self.timeout, lambda _: dialing.Dialed())
        conn = self.spec.connection_class(**self._kwargs)
        conn.connect()
        return conn

    def client(self, timeout: float | None = None) -> redis.Redis:
        """A plain redis-py client with this node's settings (``timeout``: for connecting and for
        each answer), for one-off admin commands (status, inventory, tests). Not for the lock
        path: it sends one command at a time."""
        # The spec's own protocol (RESP2 is only forced on the lock path): redis-py's pub/sub
        # and maintenance-notification machinery expect to choose it.
        kwargs = {k: v for k, v in self._kwargs.items() if k != "protocol"}
        kwargs["protocol"] = self.spec.connection_kwargs.get("protocol")
        if timeout is not None:
            kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout)
        pool = redis.ConnectionPool(connection_class=self.spec.connection_class, **kwargs)
        return redis.Redis(connection_pool=pool)


#: One flusher per event loop (``pipes.Flusher``); closed loops' are dropped (it holds its loop).
_FLUSHERS: dict[asyncio.AbstractEventLoop, Flusher] = {}


def _flusher_of(loop: asyncio.AbstractEventLoop) -> Flusher:
    return of_loop(_FLUSHERS, loop, Flusher)


Made = Future[Any] | asyncio.Future[Any]  # a connect: in our thread pool, or on the loop


class _Attempt:
    """A connect in progress for a loop's pipe: the thread's work, and the pipe it becomes."""

    __slots__ = ("made", "pipe")

    def __init__(self, made: Made | None, pipe: asyncio.Future[Pipe]) -> None:
        self.made = made
        self.pipe = pipe


def _discard(made: Made) -> None:
    if not made.cancelled() and made.exception() is None:
        made.result().disconnect()


class _Connecting:
    """A connect in progress for the threads' pipe: its result, once ``done``."""

    __slots__ = ("done", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: Pipe | Exception = TimeoutError("no connection within the node budget")


_ALL_NODES: weakref.WeakSet[Node] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for node in list(_ALL_NODES):
        node._forget()  # noqa: SLF001 (this module's own hook)


os.register_at_fork(after_in_child=_after_fork_in_child)
