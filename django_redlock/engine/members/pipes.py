"""One pipelined connection to one master, shared by every concurrent caller in the process.

Redis answers a connection's requests in the order they came, so one connection can carry every
concurrent round: a round appends a *slot* to the pipe's queue and writes its request; each reply
read fills the oldest slot. A thousand tasks then cost one connection per master, not a thousand.

- A slot whose round gave up (its deadline passed) is *abandoned*: it stays in the queue, and its
  reply is read and dropped when it comes, never handed to another round. A pipe whose oldest slot
  is abandoned *owes* replies: its master was silent past someone's budget.
- Sync pipes (threads): whoever waits reads, for everyone (one reader at a time; the others sleep
  on a condition and are woken when replies were handed out or the reader leaves).
- Async pipes (one per event loop): the loop's reader callback reads. The first request of a loop
  tick is written at once; those that follow in the same tick go out together in one write at its
  end (a thousand tasks cost a few writes, one caller no added latency). The tick ends, for a
  pipe, when the loop reads it again or calls back its queued requests' write: a lone round
  (its replies read before its next request) costs the loop no pass of its own for that.
- redis-py opens the connection (TLS, AUTH, ACL user, SELECT, unix sockets, URL options); after
  that we use its socket directly: non-blocking, through our own hiredis reader.
- After ``fork()`` a child never reads its parent's pipes (``connections`` forgets them).
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import threading
import time
import weakref
from collections import deque

import hiredis
import redis
from redis._parsers.base import BaseParser

from .dialing import Connected
from .slots import PENDING, Broken, Slot, oldest, stamped

#: A pipe with this many unanswered requests is closed: its master has been silent for long, and
#: what we told it is more than we want replayed when it wakes up.
MAX_PENDING = 10_000

#: How much one read takes from the socket at most (a read that fills it reads again).
_READ_SIZE = 65536

#: The socket has no data yet (plain, or TLS with no complete record); also ``inboxes``.
NOT_YET = (BlockingIOError, ssl.SSLWantReadError)


class Pipe:
    """One open connection to a master, shared by concurrent rounds."""

    closed: bool
    opened_at: float
    latency: float
    loop: asyncio.AbstractEventLoop | None
    _fd: int
    _conn: Connected
    _finalizer: weakref.finalize[[], Pipe]
    _writing: bool
    _out: bytearray
    _unsent: list[Slot]
    _flusher: Flusher
    _in_tick: bool
    _read_lock: threading.Lock
    _write_lock: threading.Lock
    _woken: threading.Condition
    _sleepers: int

    def __init__(
        self,
        conn: Connected,
        loop: asyncio.AbstractEventLoop | None = None,
        flusher: Flusher | None = None,
    ) -> None:
        sock = conn._sock  # noqa: SLF001 (redis-py's connection keeps no public handle on it)
        if sock is None:
            raise redis.ConnectionError("connection closed during its handshake")
        sock.setblocking(False)
        self._conn = conn
        self._sock: socket.socket = sock
        # Closes the connection if the pipe is dropped unclosed (an engine never closed): kept
        # reachable by it, the socket is never finalized first (a ResourceWarning), in any order.
        self._finalizer = weakref.finalize(self, conn.disconnect)
        self._fd = sock.fileno()
        self._reader: hiredis.Reader = hiredis.Reader(
            # Error replies come back (not raised) as redis-py's classes: NoScriptError, ...
            protocolError=redis.exceptions.InvalidResponse,
            replyError=BaseParser.parse_error,
        )
        self._buffer = bytearray(_READ_SIZE)  # hiredis copies what it is fed
        #: The slots of the requests in flight, oldest first (each reply read fills the oldest).
        self.pending: deque[Slot] = deque()
        self.closed = False
        self.opened_at = time.monotonic()
        self.scripts: set[str] = set()  # SHAs whose source was written here (``packing``)
        #: Recent round trips (seconds, smoothed; sync pipes): whose replies a thread awaits first.
        self.latency = 0.0
        self.loop = loop
        if loop is None:
            self._write_lock = threading.Lock()
            self._read_lock = threading.Lock()
            self._woken = threading.Condition(threading.Lock())
            self._sleepers = 0
            # One poll object for every wait of its reader (None on Windows: select() there).
            self._poller: select.poll | None = select.poll() if hasattr(select, "poll") else None
            if self._poller is not None:
                self._poller.register(sock, select.POLLIN)
        else:
            self._out = bytearray()
            self._unsent = []
            assert flusher is not None  # noqa: S101
            self._flusher = flusher
            self._in_tick = False  # this tick's first request went out already
            self._writing = False
            loop.add_reader(self._fd, self._readable)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.pending)} pending"
        return f"<Pipe fd={self._fd} {state}>"

    # --- writing -----------------------------------------------------------------------------

    def send(
        self, request: bytes, now: float, slots: tuple[Slot, ...] = (), *, preamble: bytes = b""
    ) -> Slot | None:
        """Queue a slot and write ``request`` (``now``: the round's monotonic time); None if the
        pipe is closed (or broke now). ``slots``: for a request of several commands, one slot per
        reply, of the caller's making (see ``acks``); the last is returned. ``preamble``: one
        command written just before it in the same write (a Cluster's ``ASKING``, which applies
        to the next command only: no other round's request between them), its reply dropped."""
        if self.loop is None and not slots and not preamble:  # (a thread's round: the usual)
            return None if len(self.pending) >= MAX_PENDING else self.write(request)
        if self.closed or len(self.pending) >= MAX_PENDING:
            return None
        slot = slots[-1] if slots else stamped(now)
        queued = slots
        if preamble:
            first = stamped(now)
            first.abandoned = True
            request = preamble + request
            queued = (first, *(slots or (slot,)))
        if self.loop is not None:
            # Appended before any byte goes out, so that a reply never finds its slot missing.
            queued = queued or (slot,)
            self.pending.extend(queued)
            if self._in_tick or self._writing or self._out:  # out at the tick's end, in order
                self._unsent.extend(queued)
                if not self._out:  # (and not writing: else out as soon as writable)
                    self._flusher.later(self)
                self._out += request
            else:  # the tick's first request: at once
                self._in_tick = True
                self._write_first(queued, request)
            return slot
        with self._write_lock:
            if self.closed:
                return None
            if queued:
                self.pending.extend(queued)
            else:
                self.pending.append(slot)
            slot.sent_at = time.monotonic()
            try:
                self._sock.sendall(request)
            except OSError as exc:  # also BlockingIOError: a request half-sent spoils the pipe
                self.close(exc)
                return None
        return slot

    def write(self, request: bytes) -> Slot | None:
        """``send`` on a threads' pipe, without slots of the caller's or a preamble (the usual);
        MAX_PENDING is the caller's check (``send``'s; a round writes here to idle pipes only)."""
        lock = self._write_lock
        lock.acquire()  # (not ``with``: part of the written-out request, see ``rounds.exchange``)
        try:
            if self.closed:
                return None
            slot = Slot()
            slot.sent_at = time.monotonic()  # stamped as it is written
            self.pending.append(slot)
            self._sock.sendall(request)
        except OSError as exc:  # (as in ``send``)
            self.close(exc)
            return None
        finally:
            lock.release()
        return slot

    def end_tick(self) -> None:
        """The loop tick is over: write what its later requests queued, in one send."""
        self._in_tick = False
        if self._out:  # (mostly not: the tick's first request went out at once)
            self._flush()

    def _write_first(self, slots: tuple[Slot, ...], request: bytes) -> None:
        """Write the tick's first request now (``_out`` is empty); the rest waits for POLLOUT."""
        now = time.monotonic()
        for slot in slots:
            slot.sent_at = now
        sent = self._send_some(request)
        if sent < len(request) and not self.closed:
            self._out += request[sent:]
            self._wait_writable()

    def _flush(self) -> None:
        """Write what is queued, in one send (what does not fit waits for POLLOUT)."""
        if self.closed or not self._out:
            return
        now = time.monotonic()
        for slot in self._unsent:
            slot.sent_at = now
        self._unsent.clear()
        sent = self._send_some(self._out)
        if self.closed:
            return
        del self._out[:sent]
        if self._out:
            self._wait_writable()

    def _send_some(self, data: bytes | bytearray) -> int:
        """Write what the socket takes of ``data`` now: how much (0 if it broke: closed)."""
        try:
            return self._sock.send(data)
        except NOT_YET:
            return 0
        except OSError as exc:
            self.close(exc)
            return 0

    def _wait_writable(self) -> None:
        if not self._writing:
            self._writing = True
            assert self.loop is not None  # noqa: S101
            self.loop.add_writer(self._fd, self._drain)

    def _drain(self) -> None:
        self._writing = False
        assert self.loop is not None  # noqa: S101
        self.loop.remove_writer(self._fd)
        self._flush()

    # --- reading -----------------------------------------------------------------------------

    def _readable(self) -> None:
        """Reader callback: replies came, a new tick began (``send``: after the old one's queue)."""
        self._in_tick = False
        self._pump()

    def _pump(self) -> None:
        """Read every reply that has arrived and hand each to its slot (never waits)."""
        reader, pending = self._reader, self.pending
        try:
            while True:
                try:
                    received = self._sock.recv_into(self._buffer)
                except NOT_YET:
                    return
                if not received:
                    raise redis.ConnectionError("connection closed by the master")
                reader.feed(self._buffer, 0, received)  # type: ignore[arg-type]
                reply = reader.gets()
                while reply is not False:
                    slot = pending.popleft()
                    if not slot.abandoned:
                        slot.reply = reply
                        if slot.on_reply is not None:
                            slot.on_reply(slot)
                    elif slot.on_late is not None:
                        slot.on_late(reply)
                    elif slot.keeps_late:
                        slot.reply = reply
                    reply = reader.gets()
                if received < _READ_SIZE:
                    return
        except (redis.RedisError, OSError, IndexError) as exc:  # IndexError: a reply nobody asked
            self.close(exc)

    def try_pump(self) -> None:
        """Read what has arrived if no one else is reading now (sync pipes)."""
        if self.loop is not None:
            self._pump()
        elif self._read_lock.acquire(False):  # (not blocking)
            try:
                self._pump()
            finally:
                self._read_lock.release()
            if self._sleepers:  # (as in ``wait``: mostly none, and no call for that)
                self._wake_sleepers()

    def wait(self, slot: Slot, deadline: float, *, fresh: bool = False) -> None:
        """Block until ``slot`` has its reply, the pipe broke, or ``deadline`` (sync pipes).

        One waiter at a time reads the socket and hands out every reply it finds; the others
        sleep until woken by it, and one of them takes over when it leaves. ``fresh``: the
        request just left, so its reply cannot be there yet: wait before the first read (a read
        that finds nothing costs a failed system call and an exception)."""
        while slot.reply is PENDING:
            if self._read_lock.acquire(False):  # (not blocking)
                remaining = 0.0  # (the clock is read only if the slot is still waiting)
                try:
                    if not fresh:
                        self._pump()
                    fresh = False
                    if slot.reply is PENDING and (remaining := deadline - time.monotonic()) > 0:
                        if self._poller is None:  # Windows: select() has no descriptor limit
                            select.select([self._sock], [], [], remaining)
                        else:
                            self._poller.poll(remaining * 1000)
                        self._pump()
                finally:
                    self._read_lock.release()
                if self._sleepers:
                    self._wake_sleepers()
            elif (remaining := deadline - time.monotonic()) > 0:
                with self._woken:
                    self._sleepers += 1
                    try:
                        # Checked after counting ourselves: a reader that left before we counted
                        # has either filled our slot or left the read lock free for us.
                        if slot.reply is PENDING and self._read_lock.locked():
                            self._woken.wait(remaining)
                    finally:
                        self._sleepers -= 1
            if remaining <= 0:
                return

    def _wake_sleepers(self) -> None:
        if self._sleepers:
            with self._woken:
                self._woken.notify_all()

    def took(self, seconds: float) -> None:
        """A reply came ``seconds`` after its request left."""
        self.latency += (seconds - self.latency) / 4

    # --- state -------------------------------------------------------------------------------

    @property
    def owes(self) -> bool:
        """The oldest unanswered request was given up on: the master has been silent."""
        first = oldest(self.pending)
        return first is not None and first.abandoned

    def stalled(self, now: float, after: float) -> bool:
        """The oldest unanswered request was given up on and sent more than ``after`` seconds
        before ``now``: the master's replies may never come (a broken path)."""
        first = oldest(self.pending)
        return first is not None and first.abandoned and now - first.sent_at > after

    def abandon(self, slot: Slot) -> None:
        """Give up on ``slot``: its reply, when it comes, is dropped."""
        slot.abandoned = True

    def close(self, error: BaseException | None = None) -> None:
        """Close the connection; every waiting slot gets ``Broken`` (once)."""
        if self.closed:
            return
        self.closed = True
        if self.loop is not None and not self.loop.is_closed():
            try:
                self.loop.remove_reader(self._fd)
                if self._writing:
                    self.loop.remove_writer(self._fd)
            except RuntimeError:  # closed from another thread than the loop's: nothing to undo
                pass
        self._finalizer()  # disconnects, once
        broken = Broken(error or redis.ConnectionError("connection closed"))
        while True:
            try:
                slot = self.pending.popleft()
            except IndexError:
                break
            if slot.reply is PENDING and not slot.abandoned:
                slot.reply = broken
                if slot.on_reply is not None:
                    slot.on_reply(slot)
        if self.loop is None:
            self._wake_sleepers()


class Flusher:
    """Ends each loop tick for the pipes of one event loop that queued requests during it (a
    second one in the tick, or more): one callback a tick for all of them, not one per pipe."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pipes: list[Pipe] = []

    def later(self, pipe: Pipe) -> None:
        if not self._pipes:
            self.loop.call_soon(self._end_tick)
        self._pipes.append(pipe)

    def _end_tick(self) -> None:
        pipes, self._pipes = self._pipes, []
        for pipe in pipes:
            pipe.end_tick()
