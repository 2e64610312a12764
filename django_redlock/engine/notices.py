"""Release notices and local waiter queues: waiters sleep until it is their turn, instead of
polling blindly.

Inside one process, the waiters of one resource queue up locally (``LocalQueues``), first come
first served; only the one at the head competes on the masters, so a thousand local waiters cost
one network waiter, and they get the lock in the order they came.

A waiter that lost an attempt is queued on each master (see ``scripts``). Each process has an inbox,
one pub/sub channel, on which it keeps one listener thread per master while it has waiters (and for
``LINGER`` seconds after). A release pops the head of the resource's queue and PUBLISHes to that
waiter's inbox only, naming the waiter; the listener wakes exactly that waiter. Notices are a hint,
never a guarantee: a waiter also wakes after a fallback timeout (a lease that simply expires sends
none, and a master may be down), and it always competes for the lock with a normal quorum attempt.

One thread-based listener serves sync and async waiters alike (async ones are woken through
``loop.call_soon_threadsafe``), so there is one implementation to get right. After ``fork()`` the
child starts with no listener and a new inbox: the parent's threads do not exist there.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis

from .connections import Node
from .events import logger
from .quarantine import abstains
from .scripts import SEVERAL_MARK

#: How long the inbox stays subscribed after its last waiter, so that a process waiting again
#: and again (a hot lock) does not pay a SUBSCRIBE round trip per wait.
LINGER = 5.0

_SEVERAL = SEVERAL_MARK.encode()


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
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop closed meanwhile: no one awaits there any more
                pass

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
        timer = loop.call_later(max(timeout, 0.0), _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            with self._guard:
                if (loop, future) in self._futures:
                    self._futures.remove((loop, future))
        return self._event.is_set()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Waiter:
    """One waiter. ``notified`` fires when a release names it (it is first in a master's queue);
    ``subscribed`` once enough masters confirmed the inbox subscription that no notice can be
    missed."""

    def __init__(self, waiter_id: str) -> None:
        #: How this waiter is named in the masters' waiter queues: "<inbox id>.<n>".
        self.id = waiter_id
        self.notified = Beacon()
        self.subscribed = Beacon()
        #: The masters whose release handed this waiter the lock (``scripts.wake``) and whose
        #: word counts as a vote (``counts_hand_off``): filled by the listeners, read by
        #: ``handoff.handed_over``.
        self.handed: set[Node] = set()
        #: Its place in the masters' queues (one resource): when it stops waiting, in ms of the
        #: Unix epoch (``scripts.ACQUIRE_WAITING``).
        self.score: int | None = None
        #: When its first queued attempt began (monotonic): a lease a release hands it began
        #: later. None before it queued.
        self.queued_since: float | None = None
        #: False once it undid an attempt after it queued: a hand-off that the undo removed may
        #: be told after it, so from then on a hand-off is only a hint (its next round confirms).
        self.trusts_hand_offs = True


def counts_hand_off(node: Node) -> bool:
    """Whether a master's word that its release handed a waiter the lock counts as its vote: not
    for a member whose votes need more than its own write (replica acknowledgement), whose
    notices may come from another server than its rounds reach (Sentinel, Cluster), or that
    abstains (quarantine). Those confirm a hand-off by a round, as any lock is taken."""
    spec = node.spec
    return spec.ack is None and spec.service is None and spec.seeds is None and not abstains(node)


class _Listener(threading.Thread):
    """Reads one master's pub/sub connection and keeps it subscribed to the wanted channels."""

    def __init__(self, hub: ReleaseNotices, node: Node) -> None:
        super().__init__(name=f"redlock-notices {node.label}", daemon=True)
        self.hub = hub
        self.node = node
        self.pubsub: Any = None
        self.subscribed: set[str] = set()  # requested on the current connection
        self.lock = threading.Lock()
        #: Set when there may be something to subscribe to, or the hub closes. One per listener:
        #: a shared one could be cleared by another listener before this one waits on it.
        self.wake = threading.Event()

    def subscribe(self, channel: str) -> None:
        """Called by a waiter's thread: subscribe now rather than at the listener's next turn.
        (redis-py's PubSub serializes sends, so this is safe beside ``get_message``.)"""
        with self.lock:
            if self.pubsub is None or channel in self.subscribed:
                return
            try:
                self.pubsub.subscribe(channel)
            except (redis.RedisError, OSError):
                return  # the listener thread sees the broken connection and reconnects
            self.subscribed.add(channel)

    def run(self) -> None:
        while not self.hub.closed:
            wanted = self.hub.wanted_channels()
            if not wanted and not self.subscribed:
                self.wake.wait(timeout=LINGER)
                self.wake.clear()
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
                self.hub.deliver(channel, message["data"], self.node)
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
        self.closed = False
        self._inbox_prefix = inbox_prefix
        self._listeners: list[_Listener] = []
        self._new_process()
        _HUBS.add(self)

    def _new_process(self) -> None:
        """State that belongs to one process: a forked child gets its own, including a guard
        that no parent thread can be holding (one that was at the fork would never let go)."""
        self._guard = threading.Lock()
        self._inbox_id = secrets.token_hex(6)
        #: Releases that wake one of our waiters publish here, and only here.
        self.inbox = self._inbox_prefix + self._inbox_id
        self._numbers = itertools.count()
        self._waiters: dict[bytes, Waiter] = {}
        #: Per waiter, the last notice acted on: every master announces each release.
        self._heard: dict[bytes, bytes] = {}
        self._confirmed_by: set[_Listener] = set()
        self._last_used = float("-inf")
        self._listeners = []

    def close(self, timeout: float = 2.0) -> None:
        """Stop the listener threads and close their connections (waits up to ``timeout``)."""
        self.closed = True
        with self._guard:
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.wake.set()
        for listener in listeners:
            listener.join(timeout)

    def listen(self) -> Waiter:
        """Register a waiter; its ``subscribed`` beacon fires once a quorum of masters will
        deliver our inbox (at once if they already do)."""
        with self._guard:
            waiter = Waiter(f"{self._inbox_id}.{next(self._numbers)}")
            self._waiters[waiter.id.encode()] = waiter
            if len(self._confirmed_by) >= self.quorum:
                waiter.subscribed.fire()
            if not self._listeners:
                self._listeners = [_Listener(self, node) for node in self.nodes]
                for listener in self._listeners:
                    listener.start()
            listeners = list(self._listeners)
        for listener in listeners:
            listener.wake.set()
            listener.subscribe(self.inbox)
        return waiter

    def unlisten(self, waiter: Waiter) -> None:
        key = waiter.id.encode()
        with self._guard:
            self._waiters.pop(key, None)
            self._heard.pop(key, None)
            self._last_used = time.monotonic()

    def wanted_channels(self) -> set[str]:
        """The inbox while there are waiters, or there were within the last LINGER seconds."""
        with self._guard:
            if self._waiters or time.monotonic() - self._last_used <= LINGER:
                return {self.inbox}
            return set()

    def heard_everywhere(self) -> bool:
        """Every master confirmed our inbox subscription: a release there can tell our waiters.
        (A release pops a queued waiter that no one hears, as one whose process is gone.)"""
        return len(self._confirmed_by) == len(self.nodes)

    def confirm(self, channel: str, listener: _Listener) -> None:
        with self._guard:
            if channel != self.inbox:
                return
            self._confirmed_by.add(listener)
            confirmed = len(self._confirmed_by) >= self.quorum
            waiters = list(self._waiters.values()) if confirmed else []
        for waiter in waiters:
            waiter.subscribed.fire()

    def unconfirm(self, channels: set[str], listener: _Listener) -> None:
        with self._guard:
            if self.inbox in channels:
                self._confirmed_by.discard(listener)

    def deliver(self, channel: str, notice: bytes, node: Node) -> None:
        """``<digest> <waiter id>[ +]``: wake that waiter, once per release (every master sends
        it), and again when a master that handed it the lock (`` +``, and its word counts: see
        ``counts_hand_off``) makes a quorum. (Waking at the first word, not only at a quorum:
        queues that disagree can split a release's keys among waiters so that none has a
        quorum, and then each must find out soon, by a round; see ``handed_over``.) The id may
        carry the mark of a waiter for several resources."""
        digest, _, named = notice.partition(b" ")
        named, _, handed = named.partition(b" ")
        named = named.removesuffix(_SEVERAL)
        with self._guard:
            waiter = self._waiters.get(named)
            if waiter is None:
                return
            wake = self._heard.get(named) != digest
            self._heard[named] = digest
            if handed and counts_hand_off(node):
                waiter.handed.add(node)
                wake = wake or len(waiter.handed) == self.quorum
        if wake:
            waiter.notified.fire()


class Turn:
    """One local waiter's place in the queue of each of its resources; ``ready`` fires when it
    is first in all of them."""

    __slots__ = ("ready", "resources")

    def __init__(self, resources: tuple[str, ...]) -> None:
        self.resources = resources
        self.ready = Beacon()


class LocalQueues:
    """The waiters of each resource in this process, in arrival order. A waiter whose turn it is
    (first in the queue of each of its resources) competes on the masters (as their queued
    waiter); when it leaves (it got the lock, gave up or was interrupted), the next one's turn
    may come.

    A lock over several resources joins all their queues at once, under one guard: every two
    waiters then stand in the same order in every queue they share, so the oldest waiter is
    always first in all of its queues, and no two wait for each other (whatever the order in
    which they named their resources)."""

    def __init__(self) -> None:
        self._new_process()
        _QUEUES.add(self)

    def _new_process(self) -> None:
        self._guard = threading.Lock()
        self._queues: dict[str, deque[Turn]] = {}

    def join(self, resources: tuple[str, ...]) -> Turn:
        turn = Turn(resources)
        with self._guard:
            for resource in resources:
                self._queues.setdefault(resource, deque()).append(turn)
            first = self._first(turn)
        if first:
            turn.ready.fire()
        return turn

    def _first(self, turn: Turn) -> bool:
        return all(self._queues[resource][0] is turn for resource in turn.resources)

    def leave(self, turn: Turn) -> None:
        following: list[Turn] = []
        with self._guard:
            for resource in turn.resources:
                queue = self._queues.get(resource)
                if queue is None or turn not in queue:
                    continue
                was_first = queue[0] is turn
                queue.remove(turn)
                if not queue:
                    del self._queues[resource]
                elif was_first and queue[0] not in following:
                    following.append(queue[0])
            ready = [waiting for waiting in following if self._first(waiting)]
        for waiting in ready:
            waiting.ready.fire()


_HUBS: weakref.WeakSet[ReleaseNotices] = weakref.WeakSet()
_QUEUES: weakref.WeakSet[LocalQueues] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The parent's waiters do not exist in the child.
    for hub in list(_HUBS):
        hub._new_process()  # noqa: SLF001 (this module's own hook)
    for queues in list(_QUEUES):
        queues._new_process()  # noqa: SLF001


os.register_at_fork(after_in_child=_after_fork_in_child)
