"""Release notices: waiters sleep until a holder releases, instead of polling blindly.

The release script PUBLISHes on the resource's channel on every master where it deleted our key.
Each process keeps one listener thread per master, subscribed only to the channels its waiters wait
on; a notice from any master wakes the local waiters of that resource. Notices are a hint, never a
guarantee: a waiter also wakes after a fallback timeout (a lease that simply expires sends none, and
a master may be down), and it always competes for the lock with a normal quorum attempt.

One thread-based listener serves sync and async waiters alike (async ones are woken through
``loop.call_soon_threadsafe``), so there is one implementation to get right. After ``fork()`` the
child starts with no listener: the parent's threads do not exist there.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import threading
import time
from collections.abc import Sequence
from typing import Any

import redis

from .events import logger
from .nodes import Node

#: How long an unused subscription is kept, so that a resource waited on again and again (a hot
#: lock) does not pay a SUBSCRIBE round trip per wait.
LINGER = 5.0


class Beacon:
    """A one-shot event that both threads and asyncio tasks can wait on."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._guard = threading.Lock()

    def fire(self) -> None:
        with self._guard:
            self._event.set()
            futures, self._futures = self._futures, []
        for loop, future in futures:
            if not loop.is_closed():
                loop.call_soon_threadsafe(_resolve, future)

    def clear(self) -> None:
        self._event.clear()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(max(timeout, 0.0))

    async def await_(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._guard:
            if self._event.is_set():
                return True
            self._futures.append((loop, future))
        try:
            await asyncio.wait_for(future, max(timeout, 0.0))
        except TimeoutError:
            return False
        return True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Waiter:
    """One waiter's interest in one channel. ``notified`` fires on a release notice that names
    this waiter or no one, ``taken`` when another waiter won the lock; ``subscribed`` once enough
    masters confirmed the subscription that no notice can be missed."""

    def __init__(self, channel: str, waiter_id: str) -> None:
        self.channel = channel
        #: How this waiter is named in the masters' waiter queues: "<inbox>.<n>".
        self.id = waiter_id
        self.notified = Beacon()
        self.taken = Beacon()
        self.subscribed = Beacon()
        #: Set with ``notified`` when a release named this waiter (first in a master's queue):
        #: it should try at once; others were not woken.
        self.called = False


class _Listener(threading.Thread):
    """Reads one master's pub/sub connection and keeps it subscribed to the wanted channels."""

    def __init__(self, hub: ReleaseNotices, node: Node) -> None:
        super().__init__(name=f"redlock-notices {node.label}", daemon=True)
        self.hub = hub
        self.node = node
        self.pubsub: Any = None
        self.subscribed: set[str] = set()  # requested on the current connection
        self.lock = threading.Lock()

    def subscribe(self, *channels: str) -> None:
        """Called by a waiter's thread: subscribe now rather than at the listener's next turn.
        (redis-py's PubSub serializes sends, so this is safe beside ``get_message``.)"""
        with self.lock:
            new = set(channels) - self.subscribed
            if self.pubsub is None or not new:
                return
            try:
                self.pubsub.subscribe(*new)
            except (redis.RedisError, OSError):
                return  # the listener thread sees the broken connection and reconnects
            self.subscribed |= new

    def run(self) -> None:
        while not self.hub.closed:
            wanted = self.hub.wanted_channels()
            if not wanted and not self.subscribed:
                self.hub.idle.wait(timeout=LINGER)
                self.hub.idle.clear()
                continue
            try:
                self._follow(wanted)
                message = self.pubsub.get_message(timeout=0.5) if self.subscribed else None
            except (redis.RedisError, OSError) as exc:
                logger.debug("release notices from %s unavailable: %s", self.node.label, exc)
                self._reset()
                time.sleep(1.0)
                continue
            if message is None:
                continue
            channel = message["channel"].decode()
            if message["type"] == "subscribe":
                self.hub.confirm(channel, self)
            elif message["type"] == "message":
                self.hub.deliver(channel, message["data"])
        self._reset()

    def _follow(self, wanted: set[str]) -> None:
        with self.lock:
            if self.pubsub is None:
                self.pubsub = self.node.client().pubsub()
            new = wanted - self.subscribed
            if new:
                self.pubsub.subscribe(*new)
                self.subscribed |= new
            stale = self.subscribed - wanted
            if stale:
                self.pubsub.unsubscribe(*stale)
                self.subscribed -= stale
                self.hub.unconfirm(stale, self)

    def _reset(self) -> None:
        with self.lock:
            if self.pubsub is not None:
                try:
                    self.pubsub.close()
                except (redis.RedisError, OSError):
                    pass
            self.pubsub = None
            self.hub.unconfirm(self.subscribed, self)
            self.subscribed = set()


class ReleaseNotices:
    """The per-process hub: waiters register here; listeners deliver notices to them."""

    def __init__(self, nodes: Sequence[Node], quorum: int, inbox_prefix: str) -> None:
        self.nodes = nodes
        self.quorum = quorum
        self._inbox_prefix = inbox_prefix
        #: This process's inbox: releases that wake one of our waiters by name publish here, so
        #: that the other processes do not even hear of it.
        self._inbox_id = secrets.token_hex(6)
        self.inbox = inbox_prefix + self._inbox_id
        self._named = itertools.count()
        self._by_id: dict[bytes, Waiter] = {}
        self.idle = threading.Event()
        self._guard = threading.Lock()
        self._waiters: dict[str, list[Waiter]] = {}
        self._last_used: dict[str, float] = {}
        self._confirmed_by: dict[str, set[_Listener]] = {}
        #: The last notice heard per channel, or per waiter for those naming one: every master
        #: announces each release, and a waiter must act on it once.
        self._heard: dict[str | bytes, bytes] = {}
        self._listeners: list[_Listener] = []
        self._pid = os.getpid()
        self.closed = False

    def close(self, timeout: float = 2.0) -> None:
        """Stop the listener threads and close their connections (waits up to ``timeout``)."""
        self.closed = True
        self.idle.set()
        with self._guard:
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.join(timeout)

    def listen(self, channel: str) -> Waiter:
        """Register a waiter; its ``subscribed`` beacon fires once a quorum of masters will
        deliver notices on ``channel`` (at once if they already do)."""
        with self._guard:
            if self._pid != os.getpid():  # forked: the parent's listener threads are not ours
                self._listeners, self._confirmed_by, self._pid = [], {}, os.getpid()
                self._inbox_id = secrets.token_hex(6)  # nor is its inbox
                self.inbox = self._inbox_prefix + self._inbox_id
                self._by_id = {}
            waiter = Waiter(channel, f"{self._inbox_id}.{next(self._named)}")
            self._waiters.setdefault(channel, []).append(waiter)
            self._by_id[waiter.id.encode()] = waiter
            if self._confirmed(channel):
                waiter.subscribed.fire()
            if not self._listeners:
                self._listeners = [_Listener(self, node) for node in self.nodes]
                for listener in self._listeners:
                    listener.start()
            listeners = list(self._listeners)
        self.idle.set()
        for listener in listeners:
            listener.subscribe(channel, self.inbox)
        return waiter

    def unlisten(self, waiter: Waiter) -> None:
        with self._guard:
            waiters = self._waiters.get(waiter.channel, [])
            if waiter in waiters:
                waiters.remove(waiter)
            self._by_id.pop(waiter.id.encode(), None)
            self._heard.pop(waiter.id.encode(), None)
            self._last_used[waiter.channel] = time.monotonic()

    def wanted_channels(self) -> set[str]:
        """Channels with waiters, or used within the last LINGER seconds."""
        now = time.monotonic()
        with self._guard:
            for channel, used in list(self._last_used.items()):
                if not self._waiters.get(channel) and now - used > LINGER:
                    del self._last_used[channel]
                    self._waiters.pop(channel, None)
                    self._heard.pop(channel, None)
            wanted = {c for c, w in self._waiters.items() if w or c in self._last_used}
            return wanted | {self.inbox} if wanted else wanted

    def _confirmed(self, channel: str) -> bool:
        """A quorum of masters delivers both ``channel`` and our inbox: nothing can be missed."""
        quorum, confirmed = self.quorum, self._confirmed_by
        return (
            len(confirmed.get(channel, ())) >= quorum
            and len(confirmed.get(self.inbox, ())) >= quorum
        )

    def confirm(self, channel: str, listener: _Listener) -> None:
        with self._guard:
            self._confirmed_by.setdefault(channel, set()).add(listener)
            channels = self._waiters if channel == self.inbox else (channel,)
            waiters = [w for c in channels if self._confirmed(c) for w in self._waiters.get(c, ())]
        for waiter in waiters:
            waiter.subscribed.fire()

    def unconfirm(self, channels: set[str], listener: _Listener) -> None:
        with self._guard:
            for channel in channels:
                self._confirmed_by.get(channel, set()).discard(listener)

    def deliver(self, channel: str, notice: bytes) -> None:
        """Act once on a notice that every master sends. On our inbox, ``<digest> <waiter id>``
        wakes that waiter alone (``called``); on a resource's channel, ``<digest> `` wakes all
        its waiters, and ``+<digest>`` tells them that one of them took the lock."""
        digest, _, named = notice.partition(b" ")
        with self._guard:
            if self._heard.get(named or channel) == digest:
                return
            self._heard[named or channel] = digest
            if named:
                waiter = self._by_id.get(named)
                waiters = [] if waiter is None else [waiter]
            else:
                waiters = list(self._waiters.get(channel, ()))
        for waiter in waiters:
            if digest.startswith(b"+"):
                waiter.taken.fire()
            else:
                waiter.called = bool(named)
                waiter.notified.fire()
