"""Our inbox's subscription on one master (``notices``): its connection, whether the master
confirmed it, and when to connect again after it failed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import redis

from .connections import Node
from .events import logger

#: How long a master whose inbox connection failed is left before connecting again.
RECONNECT = 1.0


class Inbox:
    """One master's connection subscribed to our inbox. Its keeper thread connects it; the holder
    of the reading turn reads it (and drops it when it broke)."""

    __slots__ = ("asked_at", "confirmed", "conn", "node", "retry_at")

    def __init__(self, node: Node) -> None:
        self.node = node
        self.conn: Any = None
        self.confirmed = False
        self.asked_at = float("-inf")  # when SUBSCRIBE was sent on ``conn`` (monotonic)
        self.retry_at = float("-inf")

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
            conn.send_command("SUBSCRIBE", channel)
        except (redis.RedisError, OSError) as exc:
            logger.debug("release notices from %s unavailable: %s", self.node.label, exc)
            if conn is not None:
                conn.disconnect()
            self.retry_at = time.monotonic() + RECONNECT
            return False
        self.asked_at = time.monotonic()
        self.conn = conn
        return True

    def socket(self) -> Any:
        """What to ``poll()`` on, or None. (redis-py keeps no public handle on it.)"""
        return getattr(self.conn, "_sock", None)

    def messages(self) -> Iterator[Any]:
        """Everything the connection has now (all of it: what its parser buffered is invisible
        to ``poll``). A broken connection is dropped, and the iteration ends."""
        conn = self.conn
        try:
            while conn is not None and conn._sock is not None and conn.can_read(timeout=0):  # noqa: SLF001
                yield conn.read_response()
        except (redis.RedisError, OSError) as exc:
            logger.debug("release notices from %s unavailable: %s", self.node.label, exc)
            self.drop(conn)

    def drop(self, conn: Any, *, retry_later: bool = True) -> None:
        """Close ``conn`` if it is still this inbox's (``retry_later``: after a failure)."""
        if conn is None:
            return
        if self.conn is conn:
            self.conn, self.confirmed = None, False
            self.retry_at = time.monotonic() + RECONNECT if retry_later else float("-inf")
        conn.disconnect()
