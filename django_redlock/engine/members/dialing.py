"""How our connections to a master are made: the settings every one of them overrides
(``lock_connection_kwargs``), an event loop's connection made on the loop itself, no thread, and
a thread's made with a plain socket (``dial``), not through redis-py's connect.

A plain TCP master named by an IP address (what a lock's masters usually are) needs no name
lookup and, without a password or a database number, no handshake: its connection is one
non-blocking ``connect()``, done (or refused: a master that is down) by the loop's next pass.
Made on a thread pool instead, every connect (and every refused reconnect to a master that is
down, tried again every round) paid a redis-py connection object, two thread hand-overs and the
GIL traffic between them: a killed master cost an async round 2.6x its bounded floor.

What it does not cover goes to redis-py's connect (on the thread pool, for a loop: see
``connections``): TLS, unix sockets,
Sentinel members, Cluster shards (a failed connect re-reads the slot map), host names
(``getaddrinfo`` blocks), credential providers, a client name,
and the quarantine's identity check. A password and a database number are covered: ``AUTH``
and ``SELECT`` are pipelined in one write, their replies read on the loop.

Bounded by the node budget, as the threads' connects are; a busy loop does not turn a connect
that succeeded into a timeout: when the budget's timer fires, the socket itself is asked
(``poll`` with no wait) before the master is blamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import encodings.idna  # noqa: F401 (see below)
import ipaddress
import os
import select
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import hiredis
import redis
from redis._parsers.base import BaseParser
from redis.backoff import NoBackoff
from redis.retry import Retry

# ``socket.getaddrinfo`` encodes a host name given as text with IDNA, importing that codec (and
# ``stringprep``, ``unicodedata``) inside a process's first connect: ~2 ms of a cold worker's
# first lock, on the path of everyone waiting behind it. Imported with the engine instead.


# Settings that every one of our connections overrides, whatever the node's URL or cache says.
def lock_connection_kwargs(connection_kwargs: Mapping[str, Any], timeout: float) -> dict[str, Any]:
    kwargs = dict(connection_kwargs)
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


@dataclass(frozen=True, slots=True)
class Address:
    """Where and how to connect to one master without redis-py's connect: read once per master
    from the settings of its redis-py connections (a master that is down is tried again every
    round)."""

    host: str
    port: int
    family: socket.AddressFamily
    keepalive: bool
    keepalive_options: tuple[tuple[int, int], ...]
    #: AUTH and SELECT, packed: sent in one write after the connect.
    handshake: tuple[tuple[Any, ...], ...]


def address_of(
    connection_class: type[redis.connection.AbstractConnection], kwargs: Mapping[str, Any]
) -> Address | None:
    """How a connection of ``connection_class`` made with ``kwargs`` (``lock_connection_kwargs``)
    is made here instead; None if it cannot be (see above)."""
    if connection_class is not redis.connection.Connection:  # TLS, unix socket, Sentinel...
        return None
    if kwargs.get("credential_provider") is not None or kwargs.get("client_name"):
        return None
    if kwargs.get("protocol", 2) not in (2, "2"):  # RESP3 needs HELLO (the lock path: RESP2)
        return None
    try:
        ip = ipaddress.ip_address(kwargs.get("host", "localhost"))
    except ValueError:
        return None  # a host name: its lookup would block
    handshake: list[tuple[Any, ...]] = []
    password, username = kwargs.get("password"), kwargs.get("username")
    if password:
        handshake.append(("AUTH", username, password) if username else ("AUTH", password))
    if kwargs.get("db"):
        handshake.append(("SELECT", int(kwargs["db"])))
    return Address(
        host=str(ip),
        port=int(kwargs.get("port", 6379)),
        family=socket.AF_INET6 if ip.version == 6 else socket.AF_INET,
        keepalive=bool(kwargs.get("socket_keepalive")),
        keepalive_options=tuple((kwargs.get("socket_keepalive_options") or {}).items()),
        handshake=tuple(handshake),
    )


class Connected(Protocol):
    """What a pipe (or a notice inbox) needs of a connection made: its socket, and how to close
    it. A redis-py connection (TLS, unix sockets, Sentinel...), or a ``Dialed``."""

    @property
    def _sock(self) -> socket.socket | None: ...

    def disconnect(self) -> None: ...


class Dialed:
    """A connection made here: its socket, and how to close it (what a pipe or an inbox needs of
    a connection; a redis-py connection object costs more to make than the connect itself)."""

    __slots__ = ("_pid", "_sock")

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._pid = os.getpid()

    def __del__(self) -> None:
        # Closed when collected, as redis-py closes its connections: one made for a connect
        # whose waiter gave up, or left by an engine dropped without close(), must not stay
        # open, nor warn (ResourceWarning) in whatever code the collector happens to run in.
        self.disconnect()

    def disconnect(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if os.getpid() == self._pid:  # (as redis-py: a forked child's close leaves it open)
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        sock.close()


def connect(
    loop: asyncio.AbstractEventLoop,
    address: Address,
    budget: float,
    fresh: Callable[[float], Connected],
) -> asyncio.Future[Connected]:
    """Connect to ``address`` within ``budget``: a non-blocking socket and its ``connect()``,
    then the handshake (AUTH, SELECT) in one write; then ``fresh(budget)`` (a ``Dialed``) holds
    the socket. Fails as redis-py's connect does: ``redis.ConnectionError``,
    ``redis.TimeoutError``, ``AuthenticationError``.

    Done at once when the kernel settled it at once (refused, or connected on loopback with no
    handshake to make): rounds then use the pipe in this loop pass, as they did a thread's
    connect that ended while the loop was busy. (Waiting a pass instead, a burst of a thousand
    rounds each found the pipe unmade and waited for it: 6% more work per round.)"""
    deadline = loop.time() + budget
    done: asyncio.Future[Connected] = loop.create_future()
    sock = socket.socket(address.family, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        _set_options(sock, address)
        try:
            sock.connect((address.host, address.port))
            in_progress = False
        except BlockingIOError:
            in_progress = not _settled(sock, writing=True)
        if not in_progress:
            _raise_for(sock)
            if not address.handshake:
                done.set_result(_adopt(fresh(budget), sock))
                return done
    except OSError as exc:
        sock.close()
        done.set_exception(_connection_error(address, exc))
        return done
    return loop.create_task(_finish(loop, address, sock, in_progress, deadline, budget, fresh))


async def _finish(
    loop: asyncio.AbstractEventLoop,
    address: Address,
    sock: socket.socket,
    in_progress: bool,
    deadline: float,
    budget: float,
    fresh: Callable[[float], Connected],
) -> Connected:
    with _failing_as_redis_py(address, sock):
        if in_progress:
            await _ready(loop, sock, deadline, writing=True)
            _raise_for(sock)
        if address.handshake:
            await _converse(loop, sock, address.handshake, deadline)
    return _adopt(fresh(budget), sock)


def dial(
    address: Address,
    budget: float,
    fresh: Callable[[float], Connected],
) -> Connected:
    """A thread's connect to ``address``: as the loop's (``connect``), with a blocking socket,
    the connect and the handshake's replies each bounded by ``budget``. redis-py's connection
    object and connect cost a warm thread ~230 us against ~40 for the socket alone (less apart
    in a cold process), paid on every fresh process's first round and first wait (ten connects
    on five masters: a cold waiter was queued 6.6-7.5 ms after asking, now 3.8-5.1)."""
    sock = socket.socket(address.family, socket.SOCK_STREAM)
    with _failing_as_redis_py(address, sock):
        _set_options(sock, address)
        sock.settimeout(budget)
        sock.connect((address.host, address.port))
        if address.handshake:
            commands = address.handshake
            sock.sendall(b"".join(hiredis.pack_command(c) for c in commands))
            reader, replies = _handshake_reader(), list[object]()
            while len(replies) < len(commands):
                _take_replies(reader, sock.recv(4096), replies)
            _check_handshake(commands, replies)
    return _adopt(fresh(budget), sock)


@contextlib.contextmanager
def _failing_as_redis_py(address: Address, sock: socket.socket) -> Iterator[None]:
    """A connect that fails closes its socket and raises what redis-py's connect would."""
    try:
        yield
    except TimeoutError:
        sock.close()
        where = f"{address.host}:{address.port}"
        raise redis.TimeoutError(f"Timeout connecting to server {where}") from None
    except OSError as exc:
        sock.close()
        raise _connection_error(address, exc) from None
    except BaseException:
        sock.close()
        raise


#: Connects of loop pipes that the loop cannot make itself run here: a busy default executor (the
#: application's) must not make a master look dead. Few threads: a connect happens once per
#: master and loop, not per request.
_CONNECT_THREADS = 8
_pool: ThreadPoolExecutor | None = None
_pool_guard = threading.Lock()


def connect_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_guard:
        if _pool is None:
            _pool = ThreadPoolExecutor(_CONNECT_THREADS, thread_name_prefix="redlock-connect")
        return _pool


def _after_fork_in_child() -> None:
    global _pool, _pool_guard
    _pool = None  # the parent's threads do not exist here
    _pool_guard = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def hand_over(loop: asyncio.AbstractEventLoop, opened: Callable[[], None]) -> None:
    """In our thread pool (a connect the loop cannot make itself): let the loop make its pipe
    of the new connection."""
    try:
        loop.call_soon_threadsafe(opened)
    except RuntimeError:  # the loop closed meanwhile: nobody awaits the connection there
        opened()  # (it closes what it cannot use: the loop is closed)


def _set_options(sock: socket.socket, address: Address) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if address.keepalive:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in address.keepalive_options:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _raise_for(sock: socket.socket) -> None:
    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if error:
        raise OSError(error, os.strerror(error))


def _settled(sock: socket.socket, *, writing: bool) -> bool:
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLOUT if writing else select.POLLIN)
    return bool(poller.poll(0))


def _adopt(conn: Connected, sock: socket.socket) -> Connected:
    conn._sock = sock  # type: ignore[misc]  # noqa: SLF001 (where a redis-py connection keeps it)
    return conn


def _connection_error(address: Address, exc: OSError) -> redis.ConnectionError:
    return redis.ConnectionError(
        f"Error {exc.errno} connecting to {address.host}:{address.port}. {exc.strerror}."
    )


async def _converse(
    loop: asyncio.AbstractEventLoop,
    sock: socket.socket,
    commands: tuple[tuple[Any, ...], ...],
    deadline: float,
) -> None:
    """Send ``commands`` in one write and read their replies; an error reply raises."""
    out = memoryview(b"".join(hiredis.pack_command(c) for c in commands))
    while out:
        try:
            out = out[sock.send(out) :]
        except BlockingIOError:
            await _ready(loop, sock, deadline, writing=True)
    reader, replies = _handshake_reader(), list[object]()
    while len(replies) < len(commands):
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            await _ready(loop, sock, deadline, writing=False)
            continue
        _take_replies(reader, data, replies)
    _check_handshake(commands, replies)


def _handshake_reader() -> hiredis.Reader:
    return hiredis.Reader(
        protocolError=redis.exceptions.InvalidResponse, replyError=BaseParser.parse_error
    )


def _take_replies(reader: hiredis.Reader, data: bytes, replies: list[object]) -> None:
    if not data:
        raise OSError(0, "Connection closed by server during the handshake")
    reader.feed(data)
    while (reply := reader.gets()) is not False:
        replies.append(reply)


def _check_handshake(commands: tuple[tuple[Any, ...], ...], replies: list[object]) -> None:
    """An error reply to the handshake raises, as redis-py's connect would."""
    for command, reply in zip(commands, replies, strict=True):
        if isinstance(reply, redis.exceptions.AuthenticationError):
            raise reply
        if isinstance(reply, redis.exceptions.ResponseError):
            if command[0] == "AUTH":
                raise redis.exceptions.AuthenticationError(str(reply))
            raise reply


async def _ready(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, deadline: float, *, writing: bool
) -> None:
    """Until ``sock`` is writable (or readable), or ``deadline`` (loop time): TimeoutError. A
    loop too busy to run the I/O callback before the timer is not the master's fault: the timer
    asks the socket itself before giving up."""
    fd = sock.fileno()
    ready: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not ready.done():
            ready.set_result(None)

    def expire() -> None:
        if ready.done():
            return
        if _settled(sock, writing=writing):
            ready.set_result(None)
        else:
            ready.set_exception(TimeoutError())

    (loop.add_writer if writing else loop.add_reader)(fd, settle)
    timer = loop.call_at(deadline, expire)
    try:
        await ready
    finally:
        timer.cancel()
        (loop.remove_writer if writing else loop.remove_reader)(fd)
