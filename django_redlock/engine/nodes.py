"""One master = its connection settings + a small pool + a per-request time budget; and the
sync fan-out that asks every master at once.

Why our own pool instead of ``redis.Redis``: a lock round must write one request to every master
before reading any reply, so that N masters cost one round trip, not N. redis-py's client API
sends and reads one command at a time; its connections, used directly, allow the split. The pool is
a plain list: checkout does no health-check poll (a dead connection shows up as a failed vote,
which the quorum absorbs) and, after ``fork()``, the child starts with none of the parent's
sockets.
"""

from __future__ import annotations

import os
import select
import socket
import ssl
import time
import weakref
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import hiredis
import redis
from redis._parsers.base import BaseParser
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from .errors import NodeFailure
from .protocol import quorum
from .scripts import Script

#: A master that let a request go unanswered for its whole budget (paused, overloaded, cut off)
#: is left out of the rounds for this long: it would most likely cost every round its budget
#: again, where a dead one refuses at once. At most ``N - quorum`` masters are left out at a
#: time, so leaving out never by itself makes a quorum impossible.
SKIP_SILENT_FOR = 1.0

#: A connection that owes more replies than this is closed instead of kept: its master has been
#: silent for long, and what we told it is more than we want replayed when it wakes up.
MAX_OWED = 100

#: Shortest time a connection attempt gets once the round's budget is spent (a socket timeout
#: of 0 would mean non-blocking, not "no time"). Reads need no such floor: a reply already
#: received counts, and we just do not wait for one.
LAST_LOOK = 0.0001

SUPPORTED_SCHEMES = ("redis", "rediss", "unix")

_ALL_NODES: weakref.WeakSet[Node] = weakref.WeakSet()
_PID = os.getpid()  # kept current by the at-fork hook: no getpid() call per connection


def _forget_all_connections() -> None:
    global _PID
    _PID = os.getpid()
    for node in list(_ALL_NODES):
        node.forget_connections()


os.register_at_fork(after_in_child=_forget_all_connections)

#: One Redis command: name then arguments, as redis-py packs them.
Command = tuple[Any, ...]


def pack(command: Command) -> list[bytes]:
    """RESP bytes of ``command``. A round sends the same command to every master, so it is
    packed once per round, not once per master; by hiredis directly (our arguments are already
    str, bytes or numbers: redis-py's wrapper around the same call would only re-check them)."""
    return [hiredis.pack_command(command)]


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs, errors, status output)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


def check_url(url: object) -> str:
    """``url`` if it is a Redis URL we can use, else ``ValueError`` naming it (masked)."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"a node must be a redis://, rediss:// or unix:// URL, got {url!r}")
    parts = urlsplit(url)
    if parts.scheme not in SUPPORTED_SCHEMES:
        raise ValueError(f"node {mask_url(url)!r} is not a redis://, rediss:// or unix:// URL")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"node {mask_url(url)!r} has no host")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"node {mask_url(url)!r} has no socket path")
    try:
        parts.port  # noqa: B018 (urlsplit checks the port lazily)
        redis.connection.parse_url(url)
    except ValueError as exc:
        raise ValueError(f"node {mask_url(url)!r} is not a valid Redis URL: {exc}") from None
    return url


@dataclass(frozen=True)
class NodeSpec:
    """Where one master is and how to talk to it, before any connection exists.

    ``label`` is safe to show (no password). ``connection_class``/``connection_kwargs`` are
    redis-py's sync ones; the async engine maps them to their ``redis.asyncio`` twins.
    """

    label: str
    connection_class: type[redis.connection.AbstractConnection]
    connection_kwargs: Mapping[str, Any]

    @classmethod
    def from_url(cls, url: str) -> NodeSpec:
        pool = redis.ConnectionPool.from_url(check_url(url))
        return cls(mask_url(url), pool.connection_class, dict(pool.connection_kwargs))

    @classmethod
    def from_pool(cls, label: str, pool: redis.ConnectionPool) -> NodeSpec:
        """Reuse an existing pool's settings (a django-redis cache) without sharing its sockets."""
        return cls(label, pool.connection_class, dict(pool.connection_kwargs))

    @property
    def identity(self) -> tuple[str, ...]:
        """Which redis-server this is, whatever the spelling: host and port (or socket path),
        not the db number. Two entries with one identity are one failure domain and must not
        vote twice. (Names are compared as written: no DNS lookup at configuration time.)"""
        kwargs = self.connection_kwargs
        if "path" in kwargs:
            return ("unix", str(kwargs["path"]))
        return (str(kwargs.get("host", "localhost")).lower(), str(kwargs.get("port", 6379)))


# Settings that every one of our connections overrides, whatever the node's URL or cache says.
def lock_connection_kwargs(spec: NodeSpec, timeout: float) -> dict[str, Any]:
    kwargs = dict(spec.connection_kwargs)
    kwargs.update(
        socket_timeout=timeout,  # the per-request budget: a slow master costs at most this
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),  # a retry would spend the budget twice; the quorum copes
        health_check_interval=0,  # a PING before our request would double its round trips
        driver_info=None,  # no CLIENT SETINFO handshake: a new connection costs one round trip
        decode_responses=False,
        encoding="utf-8",  # the same bytes for every master: a round's request is packed once
        encoding_errors="strict",
        protocol=2,  # RESP3 would need a HELLO round trip on every new connection
    )
    kwargs.pop("connection_pool", None)
    return kwargs


class Node:
    """One master: its spec, budget and a pool of idle sync connections."""

    def __init__(self, spec: NodeSpec, timeout: float) -> None:
        self.spec = spec
        self.label = spec.label
        self.timeout = timeout
        self._kwargs = lock_connection_kwargs(spec, timeout)
        # list.pop() and list.append() are atomic: no lock on the hot path.
        self._idle: list[Wire] = []
        #: SHAs of the scripts this master has run for us: those go as EVALSHA, others with
        #: their source (EVAL), so that a master too slow to answer in time is never left with
        #: a request it cannot run (a late NOSCRIPT would be read by no one).
        self.warm: set[str] = set()
        #: Monotonic time until which rounds leave this master out (see SKIP_SILENT_FOR).
        self.silent_until = 0.0
        _ALL_NODES.add(self)

    def __repr__(self) -> str:
        return f"<Node {self.label}>"

    def idle(self) -> Wire | None:
        """An idle connection, if there is one (no I/O)."""
        try:
            return self._idle.pop()
        except IndexError:
            return None

    def connect(self, deadline: float) -> Wire:
        """A new connection, its handshake (TLS, AUTH, SELECT) bounded by ``deadline``."""
        conn = self.spec.connection_class(**self._kwargs)
        remaining = max(deadline - time.monotonic(), LAST_LOOK)
        conn.socket_connect_timeout = conn.socket_timeout = remaining
        conn.connect()
        return Wire(conn)

    def checkin(self, wire: Wire) -> None:
        if wire.pid == _PID:  # made before a fork: the parent's, never the child's
            self._idle.append(wire)

    def close(self) -> None:
        idle, self._idle = self._idle, []
        for wire in idle:
            wire.close()

    def forget_connections(self) -> None:
        """After fork: the child must not read replies meant for its parent on shared sockets
        (nor close them: redis-py only shuts a socket down in the process that opened it)."""
        self._idle = []

    def client(self) -> redis.Redis:
        """A plain redis-py client with this node's settings, for one-off admin commands
        (status, inventory, tests). Not for the lock path: it sends one command at a time."""
        # The spec's own protocol (RESP2 is only forced on the lock path): redis-py's pub/sub
        # and maintenance-notification machinery expect to choose it.
        kwargs = {k: v for k, v in self._kwargs.items() if k != "protocol"}
        kwargs["protocol"] = self.spec.connection_kwargs.get("protocol")
        pool = redis.ConnectionPool(connection_class=self.spec.connection_class, **kwargs)
        return redis.Redis(connection_pool=pool)


#: The socket has no data yet (plain, or TLS with no complete record).
_NOT_YET = (BlockingIOError, ssl.SSLWantReadError)

#: What ``Wire.read_nowait`` returns while the reply has not arrived.
PENDING = object()


class Wire:
    """One open connection of the lock path. redis-py opens it (TLS, AUTH, SELECT, its URL
    options); after that we talk to its socket ourselves, non-blocking, through our own hiredis
    reader. A round's reply is usually there by the time we read it, so a read is one
    ``recv_into``: no timeout juggling (two ``ioctl`` per read in redis-py), no poll before
    every read, no per-call layers. Only when a master has not answered yet do we wait, and
    never past the round's deadline: blocking in ``poll`` (sync), or on the event loop's reader
    callback (asyncio), so that one pool of connections serves both."""

    __slots__ = ("_buffer", "_conn", "_reader", "_sock", "closed", "owed", "pid")

    def __init__(self, conn: redis.connection.AbstractConnection) -> None:
        self._conn = conn
        sock = conn._sock  # noqa: SLF001 (redis-py keeps no public handle on it)
        if sock is None:
            raise redis.ConnectionError("connection closed during its handshake")
        sock.setblocking(False)
        self._sock: socket.socket = sock
        self._reader: hiredis.Reader = hiredis.Reader(
            # Error replies come back (not raised) as redis-py's classes: NoScriptError, ...
            protocolError=redis.exceptions.InvalidResponse,
            replyError=BaseParser.parse_error,
        )
        self._buffer: bytearray = bytearray(4096)  # hiredis copies what it is fed
        self.pid: int = conn.pid
        #: Replies to requests nobody waits for any more (a master that missed its budget, or
        #: one told without waiting): read and discarded before the next reply we want. The
        #: connection stays usable, and what we send on it stays in order (a release sent on
        #: it cannot overtake the SET it undoes; one that goes out on another connection, after
        #: a reconnect or from another thread, can, and then that SET's key lasts its TTL).
        self.owed: int = 0
        self.closed: bool = False

    def send(self, packed: list[bytes]) -> bool:
        """Write a request; False (connection closed) if it could not be written whole."""
        try:
            self._sock.sendall(packed[0] if len(packed) == 1 else b"".join(packed))
        except OSError:  # also BlockingIOError: a request that does not fit is not half-sent
            self.close()
            return False
        return True

    def read_nowait(self) -> object:
        """The next reply we wait for, if it has arrived (an error reply is a ``ResponseError``
        object, returned), else ``PENDING``. Owed replies are discarded first. Raises
        ``ConnectionError``/``OSError`` with the connection closed."""
        try:
            while True:
                reply = self._next()
                if reply is PENDING or not self.owed:
                    return reply
                self.owed -= 1
        except (redis.RedisError, OSError):
            self.close()
            raise

    def caught_up(self) -> bool:
        """Read and discard the owed replies that have arrived, without waiting; whether none
        is owed any more (False also if the connection broke: it is closed then)."""
        try:
            while self.owed:
                if self._next() is PENDING:
                    return False
                self.owed -= 1
        except (redis.RedisError, OSError):
            self.close()
            return False
        return True

    def _next(self) -> object:
        reader = self._reader
        reply = reader.gets()
        while reply is False:
            try:
                received = self._sock.recv_into(self._buffer)
            except _NOT_YET:
                return PENDING
            if not received:
                raise redis.ConnectionError("connection closed by the master")
            reader.feed(self._buffer, 0, received)  # type: ignore[arg-type]
            reply = reader.gets()
        return reply

    def fileno(self) -> int:
        return self._sock.fileno()

    def wait_readable(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds until the socket has data (or is closed)."""
        timeout = max(timeout, 0.0)  # poll() takes a negative timeout as "forever"
        if not hasattr(select, "poll"):  # Windows: select() has no descriptor limit there
            select.select([self._sock], [], [], timeout)
            return
        poller = select.poll()
        poller.register(self._sock, select.POLLIN)
        poller.poll(timeout * 1000)

    def close(self) -> None:
        self.closed = True
        self._conn.disconnect()


Reply = object  # a master's raw answer, or a NodeFailure when it gave none within its budget


def failure(node: Node, exc: BaseException) -> NodeFailure:
    kind = "timeout" if isinstance(exc, redis.TimeoutError | TimeoutError) else "error"
    return NodeFailure(node.label, kind, f"{type(exc).__name__}: {exc}")


class Requests:
    """One round's request, packed once in each form it is sent in."""

    def __init__(self, command: Command, script: Script | None) -> None:
        self.command = command
        self.script = script
        self._packed = pack(command)
        self._with_source: list[bytes] | None = None

    def for_node(self, node: Node) -> list[bytes]:
        if self.script is None or self.script.sha in node.warm:
            return self._packed
        return self.with_source()

    def with_source(self) -> list[bytes]:
        """The script request as EVAL with the script's source (no NOSCRIPT possible)."""
        if self._with_source is None:
            assert self.script is not None  # noqa: S101
            self._with_source = pack(("EVAL", self.script.source, *self.command[2:]))
        return self._with_source

    def forgot_script(self, node: Node, reply: Reply) -> bool:
        """Whether ``reply`` says the master lost our script (flushed, restarted)."""
        if self.script is not None and isinstance(reply, NoScriptError):
            node.warm.discard(self.script.sha)
            return True
        return False

    def answered(self, node: Node) -> None:
        if self.script is not None:
            node.warm.add(self.script.sha)


@dataclass(frozen=True, slots=True)
class Connect:
    """I/O a round waits on: a new connection to ``node`` by ``deadline``. Answered with the
    ``Wire`` or the exception that prevented it."""

    node: Node
    deadline: float


@dataclass(frozen=True, slots=True)
class Readable:
    """I/O a round waits on: data on ``wire``, for at most ``timeout`` seconds."""

    wire: Wire
    timeout: float


Exchange = Generator[Connect | Readable, object, list[Reply]]


def exchange(
    nodes: Sequence[Node], command: Command, budget: float, script: Script | None = None
) -> Exchange:
    """One round, written once for both drivers (``fan_out`` blocks, ``aio.afan_out`` awaits):
    send ``command`` to every master, all before reading any reply; then read every reply by one
    common deadline ``budget`` seconds from now. A master that has not answered by then counts
    as failed; its connection keeps the reply owed (read and discarded later, never mistaken for
    the answer to another request) and the master is *silent* for SKIP_SILENT_FOR seconds: the
    next rounds tell it their request on that connection without waiting for it (so that a
    release still follows its SET there, in order), and count it as failed, until its owed
    replies have come. ``script``: the script ``command`` runs (EVALSHA), sent with its source
    to masters not known to have it, and resent so to one that answers NOSCRIPT. Yields only
    when it must wait: for a new connection, or for a master that has not answered yet."""
    began = time.monotonic()
    deadline = began + budget
    requests = Requests(command, script)
    replies: list[Reply] = [None] * len(nodes)
    in_flight: list[tuple[int, Wire, bool]] = []  # (master, connection, was idle)
    may_leave_out = len(nodes) - quorum(len(nodes))
    try:
        unconnected = []
        # Masters with an open connection first, so that a slow handshake elsewhere delays no one.
        for i, node in enumerate(nodes):
            wire = node.idle()
            if node.silent_until > began and may_leave_out > 0:
                if wire is None or not wire.caught_up():
                    may_leave_out -= 1
                    replies[i] = _tell(node, wire, requests.for_node(node))
                    continue
                node.silent_until = 0.0  # its late replies came: it answers again
            elif wire is not None and wire.owed and not wire.caught_up():
                # Silent for a while and still owing: its replies may never come (a broken
                # path, not a paused master). Ask it afresh rather than behind them.
                wire.close()
                wire = None
            if wire is not None and wire.send(requests.for_node(node)):
                in_flight.append((i, wire, True))
            else:  # none idle, or it went stale while idle (master restarted): one fresh try
                unconnected.append(i)
        for i in unconnected:
            node = nodes[i]
            made = yield from _connect(node, deadline, budget)
            if not isinstance(made, Wire):
                replies[i] = made
            elif made.send(requests.for_node(node)):
                in_flight.append((i, made, False))
            else:
                replies[i] = NodeFailure(node.label, "error", "connection lost while sending")
        if in_flight:
            # Replies take longer than our writes: a read now would find nothing and raise.
            # Wait for the first one instead (at once if it is there after all).
            yield Readable(in_flight[0][1], max(deadline - time.monotonic(), 0.0))
        while in_flight:
            i, wire, reused = in_flight[0]
            node = nodes[i]
            reply = _reply_now(node, wire)
            if reply is PENDING:
                reply = yield from _read(node, wire, deadline)
            if reused and isinstance(reply, NodeFailure) and reply.reason == "error":
                # The idle connection was closed by the master (restart, client timeout) and the
                # send went into the void: one fresh try within the same deadline. Safe to
                # repeat: our scripts are idempotent, and a repeated SET NX can only under-count
                # our votes.
                made = yield from _connect(node, deadline, budget)
                if not isinstance(made, Wire):
                    in_flight.pop(0)
                    replies[i] = made
                    continue
                in_flight[0] = (i, wire := made, False)
                reply = yield from _resend(node, wire, requests.for_node(node), deadline)
            if requests.forgot_script(node, reply):
                reply = yield from _resend(node, wire, requests.with_source(), deadline)
            in_flight.pop(0)
            if isinstance(reply, NodeFailure):
                if not wire.closed:  # it missed the deadline: its reply is owed, kept for later
                    node.checkin(wire)
            elif isinstance(reply, Exception):
                # An error reply. Every one counts as a failed vote, whatever its class: redis-py
                # maps LOADING, NOAUTH, "max number of clients" to classes that are not
                # ResponseErrors, and none of them is a grant. After a ConnectionError one (the
                # master is closing on us) the connection is not kept.
                if isinstance(reply, redis.ConnectionError):
                    wire.close()
                else:
                    node.checkin(wire)
                reply = failure(node, reply)
            else:
                requests.answered(node)
                node.checkin(wire)
            replies[i] = reply
    except BaseException:
        # Interrupted (a cancelled task, Ctrl-C): replies may still arrive on every connection
        # not yet read; none may be read later as the answer to another request.
        for _, wire, _ in in_flight:
            wire.close()
        raise
    return replies


def _connect(node: Node, deadline: float, budget: float) -> Generator[Connect, object, Reply]:
    """A new connection, or the NodeFailure that stands for the master's vote. A master that
    could not be reached in time is silent (see SKIP_SILENT_FOR) only if it had at least half
    the budget: running out of a budget that other masters spent is not its fault."""
    fair = deadline - time.monotonic() >= budget / 2
    made = yield Connect(node, deadline)
    if isinstance(made, Wire):
        return made
    lost = failure(node, made)  # type: ignore[arg-type]
    if fair and lost.reason == "timeout":
        node.silent_until = time.monotonic() + SKIP_SILENT_FOR
    return lost


def _tell(node: Node, wire: Wire | None, packed: list[bytes]) -> NodeFailure:
    """Send to a silent master without waiting for its answer (on its connection, after the
    requests it has not answered yet), or not at all if it has no connection."""
    silent = "silent: it let a request go unanswered for its whole budget"
    if wire is None or wire.owed >= MAX_OWED or not wire.send(packed):
        if wire is not None:
            wire.close()
        return NodeFailure(node.label, "timeout", f"{silent}; not asked")
    wire.owed += 1
    node.checkin(wire)
    return NodeFailure(node.label, "timeout", f"{silent}; told, not waited for")


def _resend(
    node: Node, wire: Wire, packed: list[bytes], deadline: float
) -> Generator[Readable, object, Reply]:
    if not wire.send(packed):
        return NodeFailure(node.label, "error", "connection lost while resending")
    return (yield from _read(node, wire, deadline))


def _reply_now(node: Node, wire: Wire) -> Reply:
    """The reply if it is here (an error reply is a ``ResponseError``), ``PENDING``, or a
    NodeFailure (connection closed)."""
    try:
        return wire.read_nowait()
    except (redis.RedisError, OSError) as exc:
        return failure(node, exc)


def _read(node: Node, wire: Wire, deadline: float) -> Generator[Readable, object, Reply]:
    """The reply, waiting for it until ``deadline``; a reply already received counts even past
    the deadline, we just do not wait for one then. (Most replies are there by the time we look:
    ``exchange`` asks ``_reply_now`` first and comes here only to wait.)"""
    reply = _reply_now(node, wire)
    while reply is PENDING:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if wire.owed < MAX_OWED:  # keep it: the reply is owed, the connection usable
                wire.owed += 1
            else:
                wire.close()
            node.silent_until = time.monotonic() + SKIP_SILENT_FOR
            return failure(node, TimeoutError("no reply within the node budget"))
        yield Readable(wire, remaining)
        reply = _reply_now(node, wire)
    return reply


def fan_out(
    nodes: Sequence[Node], command: Command, budget: float, script: Script | None = None
) -> list[Reply]:
    """``exchange`` with blocking waits."""
    rounds = exchange(nodes, command, budget, script)
    answer: object = None
    while True:
        try:
            wait = rounds.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        try:
            if isinstance(wait, Readable):
                wait.wire.wait_readable(wait.timeout)
                answer = None
            else:
                answer = connect(wait)
        except BaseException:
            rounds.close()  # interrupted (Ctrl-C): drop the connections still awaited
            raise


def connect(wait: Connect) -> Wire | Exception:
    """Perform a ``Connect`` (blocking): the connection, or why there is none."""
    try:
        return wait.node.connect(wait.deadline)
    except (redis.RedisError, OSError) as exc:
        return exc
