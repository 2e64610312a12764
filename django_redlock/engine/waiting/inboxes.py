"""Our inbox's subscription on one master (``notices``): its connection, whether the master
confirmed it, and when to connect again after it failed."""

from __future__ import annotations

import socket
import time
from typing import Any

import hiredis
import redis

from ..base.events import logger
from ..members.connections import Node
from ..members.dialing import Connected
from ..members.pipes import NOT_YET
from .waiter import votes_by_word

#: How long a master whose inbox connection failed is left before connecting again.
RECONNECT = 1.0

#: How much one read takes from the socket at most (notices are a few dozen bytes each).
_READ_SIZE = 16384


class Inbox:
    """One master's connection subscribed to our inbox. Its keeper thread connects it; the holder
    of the reading turn reads it (and drops it when it broke). It is connected as the lock
    path's are (``Node.subscriber``), and its socket read directly, non-blocking, through our
    own hiredis reader (as ``pipes`` do: redis-py's ``can_read``/``read_response`` cost a
    reading thread several times the notice itself, and a hand-off waits on it)."""

    __slots__ = ("_reader", "asked_at", "confirmed", "conn", "node", "retry_at", "sock", "votes")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.conn: Connected | None = None
        self.sock: socket.socket | None = None  # ``conn``'s, while it is open
        self._reader = hiredis.Reader()
        self.confirmed = False
        self.asked_at = float("-inf")  # when SUBSCRIBE was sent on ``conn`` (monotonic)
        self.retry_at = float("-inf")
        #: Its word that a release handed a waiter the lock counts as its vote, unless it
        #: abstains at the time (``waiter.votes_by_word``).
        self.votes = votes_by_word(node)

    def settled(self, now: float) -> bool:
        """Confirmed, or not worth waiting for now: it failed lately, or it has had its budget
        to confirm (a master that stopped answering must not delay every new waiter)."""
        if self.confirmed or self.retry_at > now:
            return True
        return self.conn is not None and now - self.asked_at > self.node.timeout

    def due(self, now: float) -> bool:
        """Without a connection, and not left alone after a failure."""
        return self.conn is None and now >= self.retry_at

    def subscribe(self, channel: str) -> bool:
        """Connect (one connect budget) and send SUBSCRIBE; False if the master cannot be
        reached now (tried again after RECONNECT). The reply is read as any notice is."""
        conn = None
        try:
            conn = self.node.subscriber()
            sock = conn._sock  # noqa: SLF001 (a redis-py connection keeps no public handle on it)
            if sock is None:
                raise redis.ConnectionError("connection closed during its handshake")
            sock.sendall(hiredis.pack_command(("SUBSCRIBE", channel)))  # type: ignore[arg-type]
            sock.setblocking(False)
        except (redis.RedisError, OSError) as exc:
            logger.debug("release notices from %s unavailable: %s", self.node.label, exc)
            if conn is not None:
                conn.disconnect()
            self.retry_at = time.monotonic() + RECONNECT
            return False
        self.asked_at = time.monotonic()
        self._reader = hiredis.Reader()  # nothing of an earlier connection's half-read reply
        self.sock, self.conn = sock, conn
        return True

    def messages(self) -> list[Any]:
        """Everything the connection has now: read until a read leaves the socket empty (one
        read, mostly: a few notices; a second would only fail, costing a call and an exception
        on a hand-off's path; what comes after it makes ``poll`` look here again). A broken
        connection is dropped: what it completed before breaking is still returned."""
        conn, sock, reader = self.conn, self.sock, self._reader
        messages: list[Any] = []
        try:
            while sock is not None:
                try:
                    data = sock.recv(_READ_SIZE)
                except NOT_YET:
                    break
                if not data:
                    raise redis.ConnectionError("connection closed by the master")
                reader.feed(data)
                message = reader.gets()
                while message is not False:
                    messages.append(message)
                    message = reader.gets()
                if len(data) < _READ_SIZE:
                    break
        except (hiredis.ProtocolError, redis.RedisError, OSError) as exc:
            logger.debug("release notices from %s unavailable: %s", self.node.label, exc)
            self.drop(conn)
        return messages

    def drop(self, conn: Connected | None, *, retry_later: bool = True) -> None:
        """Close ``conn`` if it is still this inbox's (``retry_later``: after a failure)."""
        if conn is None:
            return
        if self.conn is conn:
            self.conn, self.sock, self.confirmed = None, None, False
            self.retry_at = time.monotonic() + RECONNECT if retry_later else float("-inf")
        conn.disconnect()
