"""Which server process a master's connections reach: its ``run_id``, read on each new
connection, and since when it is that one. A new ``run_id`` means the master restarted (or failed
over to another process), empty unless it persists: a lease it granted before may be gone there,
and a release that finds it gone there has no confirmation of it (``restarts``).

How it is read: ``INFO server`` is written on each new connection before it becomes a pipe, so
before any round's request on it; its reply is the pipe's first, read before any round's on that
connection (a pipe answers in order). No round waits for it, and the connect takes no longer: a
paused master's connect is not held up by it. A master that refuses the connection with an error
reply ("max number of clients reached", ``LOADING``) fails the connect, or its pipe, with that
error's own words. A watched member (quarantine) reads its identity while it connects
(``connections``): that one is taken instead.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import hiredis
import redis
from redis._parsers.base import BaseParser

from .dialing import Connected
from .pipes import Pipe
from .quarantine import parse_run_id
from .slots import stamped

_INFO_SERVER = hiredis.pack_command(("INFO", "server"))  # type: ignore[arg-type]


class Incarnation:
    """The server process behind one master's connections, as last seen in this process."""

    __slots__ = ("asks", "restarted_at", "run_id")

    def __init__(self, *, asks: bool = True) -> None:
        #: Whether a new pipe asks (False: the member's identity is read as it connects).
        self.asks = asks
        #: The ``run_id`` last seen (None: not read yet, or INFO refused).
        self.run_id: str | None = None
        #: When (monotonic) a new connection first found another process than before (0: never).
        self.restarted_at = 0.0

    def piped(self, conn: Connected, make: Callable[[Connected], Pipe]) -> Pipe:
        """``make(conn)``: a pipe on ``conn`` (new, not shared yet, its socket's send buffer
        empty) whose first request is ``INFO server``; its reply, when read, goes to ``_told``."""
        if not self.asks:
            return make(conn)
        sock = conn._sock  # noqa: SLF001 (as ``pipes``: no public handle on it)
        try:
            if sock is None or sock.send(_INFO_SERVER) != len(_INFO_SERVER):
                raise redis.ConnectionError("the new connection would not take INFO at once")
            _refused(sock)
        except (redis.RedisError, OSError):
            conn.disconnect()
            raise
        pipe = make(conn)
        slot = stamped(time.monotonic())
        slot.abandoned = True  # (no round waits for it: its reply goes to ``on_late``)
        slot.on_late = lambda reply: self._told(reply, pipe)
        pipe.pending.append(slot)  # (the first: nothing else was written, nor read)
        return pipe

    def _told(self, reply: object, pipe: Pipe) -> None:
        if isinstance(reply, redis.ConnectionError):  # (max clients, LOADING: it closes on us)
            pipe.close(reply)
        self.saw(parse_run_id(reply))

    def saw(self, run_id: str | None) -> None:
        """A new connection reached the process ``run_id`` (None: it would not say)."""
        if run_id != self.run_id:
            if run_id is not None and self.run_id is not None:
                self.restarted_at = time.monotonic()
            self.run_id = run_id

    def changed_since(self, when: float) -> bool | None:
        """Whether a new connection found another process here after ``when`` (monotonic): it
        restarted or failed over since. None: it cannot tell (never read)."""
        if self.run_id is None:
            return None
        return self.restarted_at > when


def _refused(sock: socket.socket) -> None:
    """Raise the error a master answered the connection with at once, if it did: one that
    closes it ("max number of clients reached"). Looked at without taking it (the pipe reads
    it, else) and without waiting: on loopback it is there already, and the next write would
    only find the connection reset."""
    sock.setblocking(False)  # (as the pipe sets it: with a timeout, Python would wait first)
    try:
        head = sock.recv(512, socket.MSG_PEEK)
    except (BlockingIOError, ValueError):  # (nothing yet; a TLS socket cannot peek)
        return
    if head.startswith(b"-") and b"\r\n" in head:
        error = BaseParser.parse_error(head[1 : head.index(b"\r\n")].decode("utf-8", "replace"))
        if isinstance(error, redis.ConnectionError):
            raise error
