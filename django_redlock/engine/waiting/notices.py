"""Release notices and local waiter queues: waiters sleep until it is their turn, instead of
polling blindly.

Inside one process, only the first waiter of a resource competes on the masters
(``local_queues``).

A waiter that lost an attempt is queued on each master (see ``scripts``). Each process has an
inbox, one pub/sub channel, to which it keeps one connection per master subscribed while it has
waiters (and for ``LINGER`` seconds after). A release pops the head of the resource's queue and
PUBLISHes to that waiter's inbox only, naming the waiter (and hands it the lock: ``handoff``).
Notices are a hint, never a guarantee: a waiter also wakes after a fallback timeout (a lease that
simply expires sends none, and a master may be down), and a waiter that is not handed the lock
competes for it with a normal quorum attempt.

Who reads the inbox connections: one thread at a time holds the *reading turn*. A waiting thread
takes it itself when it is free (``ReleaseNotices.wait``): it sleeps in ``poll()`` on every
master's connection at once, so a release wakes the very thread that waits for it, once, with the
words of all the masters that answered meanwhile; no listener thread has to be scheduled first and
then wake it (measured: a second thread switch was a third of a hand-off's gap on a busy 2-CPU
machine). Other waiting threads sleep until the reader fires their beacon or passes the turn on.
A process's one keeper thread connects and subscribes (a master that is down costs it, not a
waiter, its connect budget), and reads while asyncio waiters wait and no thread reads for itself
(they are woken through ``loop.call_soon_threadsafe``). After ``fork()`` the child starts with no
keeper, no connections of its own and a new inbox: the parent's threads do not exist there.
"""

from __future__ import annotations

import itertools
import os
import secrets
import select
import socket
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence

from ..base.beacon import Beacon
from ..members.connections import Node
from .inboxes import Inbox
from .notice_reading import NoticeReading
from .waiter import Waiter

#: How long the inbox stays subscribed after its last waiter, so that a process waiting again
#: and again (a hot lock) does not pay a SUBSCRIBE round trip per wait.
LINGER = 5.0
#: The keeper's longest sleep or read between two looks at what its connections need.
KEEPER_TURN = 0.5


#: The reading turn's holder when it is the keeper thread (else a waiting thread's beacon).
_KEEPER = object()


class ReleaseNotices(NoticeReading):
    """The per-process hub: waiters register here, and the holder of the reading turn delivers
    the masters' notices to them (see the module's docstring)."""

    def __init__(self, nodes: Sequence[Node], quorum: int, inbox_prefix: str) -> None:
        self.nodes = nodes
        self.quorum = quorum
        self.closed = False
        self._inbox_prefix = inbox_prefix
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
        self._asynchronous = 0  # how many of them wait on an event loop (the keeper reads)
        #: Per waiter, the last notice acted on: every master announces each release.
        self._heard: dict[bytes, bytes] = {}
        self._inboxes = [Inbox(node) for node in self.nodes]  # the parent's: not closed here
        self._last_used = float("-inf")
        #: Who reads (a waiting thread's beacon, ``_KEEPER``, or None), and the threads waiting
        #: for the turn, first come first served.
        self._reader: object = None
        self._standby: deque[Beacon] = deque()
        self._keeper_yields = False  # a thread asked the keeper for the turn
        self._keeper: threading.Thread | None = None
        self._keeper_wake = threading.Event()
        #: A reader's ``poll()`` also watches this pair's second end: rung when it should look
        #: again (a new connection, a thread asking the keeper for the turn, close). Made with
        #: the keeper, closed when it stops (a fork's child closes its copy of the parent's).
        for end in getattr(self, "_bell", ()):
            end.close()
        self._bell: tuple[socket.socket, ...] = ()
        #: The reader's poll object and what it watches (``_poller``).
        self._polled: list[socket.socket | None] = []
        self._polling: tuple[select.poll, dict[int, Inbox]] = (select.poll(), {})

    def close(self, timeout: float = 2.0) -> None:
        """Stop the keeper and close the inbox connections (waits up to ``timeout``)."""
        self.closed = True
        with self._guard:
            keeper = self._keeper
            standby = list(self._standby)
        self._ring()
        self._keeper_wake.set()
        for beacon in standby:
            beacon.nudge()
        if keeper is not None:
            keeper.join(timeout)
        else:
            self._disconnect_all()

    # --- waiters ---------------------------------------------------------------------------

    def listen(self, asynchronous: bool = False) -> Waiter:
        """Register a waiter; its ``subscribed`` beacon fires once a quorum of masters will
        deliver our inbox (at once if they already do). ``asynchronous``: it waits on an event
        loop, so the keeper reads for it."""
        with self._guard:
            waiter = Waiter(f"{self._inbox_id}.{next(self._numbers)}")
            waiter.asynchronous = asynchronous
            self._waiters[waiter.id.encode()] = waiter
            self._asynchronous += asynchronous
            if self._confirmations() >= self.quorum:
                waiter.subscribed.fire()
            if self._keeper is None and not self.closed:
                self._bell = socket.socketpair()
                for end in self._bell:
                    end.setblocking(False)
                self._keeper = threading.Thread(
                    target=self._keep,
                    name=f"redlock-notices {', '.join(node.label for node in self.nodes)}",
                    daemon=True,
                )
                self._keeper.start()
        self._keeper_wake.set()
        return waiter

    def unlisten(self, waiter: Waiter) -> None:
        key = waiter.id.encode()
        with self._guard:
            if self._waiters.pop(key, None) is not None:
                self._asynchronous -= waiter.asynchronous
            self._heard.pop(key, None)
            self._last_used = time.monotonic()

    def wait(self, beacon: Beacon, timeout: float, settle: bool = False) -> bool:
        """A waiting thread's sleep until ``beacon`` fires, or ``timeout``; answers whether it
        fired. It reads the masters' notices itself while it holds the reading turn (taken
        from the keeper if need be), else sleeps until the reader fires its beacon or passes
        the turn on. ``settle`` (a new waiter's ``subscribed``): reading, it also waits for the
        confirmations of the masters still to answer, not only a quorum's (no one reads them
        once it stops, until its next wait; see ``heard_everywhere``)."""
        if settle:
            done: Callable[[], bool] = lambda: beacon.fired and self._settled()  # noqa: E731
        else:
            done = lambda: beacon.fired  # noqa: E731
        return self._wait(beacon, done, time.monotonic() + timeout, None)

    def wait_notice(self, waiter: Waiter, timeout: float, budget: float) -> bool:
        """``wait`` for a release's word to ``waiter`` (``notified``). Woken by a master's word
        that the release handed it the lock, its reader reads on until a quorum's words came
        (or ``budget`` after the first: a split, see ``handoff.handed_over``), so that it takes
        the lock in one wake-up, not one per word (measured: a second wake-up in half of the
        hand-offs); and no further (the other masters' words wait in their sockets, read at the
        next wait, off the hand-off's path). A thread that another reads for returns at the
        first word, as from ``wait``; ``handed_over`` then asks for the rest."""
        beacon, handed, quorum = waiter.notified, waiter.handed, self.quorum
        until = time.monotonic() + timeout

        def enough() -> bool:  # (a quorum's words: what other masters said can wait)
            return len(handed) >= quorum

        def done() -> bool:
            return beacon.fired and (
                not handed
                or enough()
                or not waiter.trusts_hand_offs  # (a round settles it: see ``handed_over``)
                or time.monotonic() >= waiter.first_handed + budget
            )

        def reads_until() -> float:
            return waiter.first_handed + budget if beacon.fired else until

        return self._wait(beacon, done, until, reads_until, enough)

    def _wait(
        self,
        beacon: Beacon,
        done: Callable[[], bool],
        until: float,
        reads_until: Callable[[], float] | None,
        enough: Callable[[], bool] | None = None,
    ) -> bool:
        try:
            while not done() and not self.closed:
                left = until - time.monotonic()
                if left <= 0:
                    break
                with self._guard:
                    reads = self._reader is None
                    if reads:
                        self._reader = beacon
                        if beacon in self._standby:
                            self._standby.remove(beacon)
                    elif beacon not in self._standby:
                        self._standby.append(beacon)
                        self._keeper_yields = self._reader is _KEEPER
                if reads:
                    try:
                        self._read(done, until, reads_until, enough)
                    finally:
                        self._pass_turn()
                elif beacon.fired:
                    break  # another thread reads: a quorum's confirmations are enough
                else:
                    if self._keeper_yields:
                        self._ring()
                    beacon.wait(left)
        finally:
            with self._guard:
                if beacon in self._standby:
                    self._standby.remove(beacon)
                after = self._standby[0] if self._reader is None and self._standby else None
            if after is not None:
                after.nudge()
        return beacon.fired

    def _pass_turn(self) -> None:
        """The reader is done: the first thread waiting for the turn takes it, else the keeper
        if asyncio waiters need a reader."""
        with self._guard:
            self._reader = None
            self._keeper_yields = False
            after = self._standby[0] if self._standby else None
            keeper = after is None and self._asynchronous > 0
        if after is not None:
            after.nudge()
        elif keeper:
            self._keeper_wake.set()

    def _ring(self) -> None:
        try:
            self._bell[0].send(b"!")
        except (IndexError, OSError):  # (BlockingIOError: rung already, not heard yet)
            pass  # no keeper, or closed: no reader

    def heard_everywhere(self) -> bool:
        """Every master confirmed our inbox subscription: a release there can tell our waiters.
        (A release pops a queued waiter that no one hears, as one whose process is gone.)"""
        return self._confirmations() == len(self.nodes)

    def _settled(self) -> bool:
        """Every master confirmed our inbox, or will not soon (``Inbox.settled``)."""
        now = time.monotonic()
        return all(inbox.settled(now) for inbox in self._inboxes)

    # --- the keeper ------------------------------------------------------------------------

    def _keep(self) -> None:
        """The keeper thread: connects and subscribes the inbox on every master while it is
        wanted, closes the connections once it is not, and reads while only asyncio waiters
        need a reader."""
        try:
            while not self.closed:
                if self._wanted():
                    self._connect_missing()
                if self._take_turn_for_keeper():
                    try:
                        if self._wanted():
                            self._read(lambda: self._keeper_yields, time.monotonic() + KEEPER_TURN)
                        else:
                            self._disconnect_all()
                    finally:
                        self._pass_turn()
                    if self._asynchronous > 0:
                        continue
                self._keeper_wake.wait(KEEPER_TURN if self._wanted() else LINGER)
                self._keeper_wake.clear()
        finally:
            # Closed: the reader sees it at once (the bell); its connections are ours to close
            # once it is gone.
            give_up = time.monotonic() + 1.0
            while not self._take_turn_at_close() and time.monotonic() < give_up:
                time.sleep(0.005)
            self._disconnect_all()
            for end in self._bell:
                end.close()

    def _take_turn_at_close(self) -> bool:
        with self._guard:
            if self._reader is None:
                self._reader = _KEEPER
            return self._reader is _KEEPER

    def _wanted(self) -> bool:
        """The inbox while there are waiters, or there were within the last LINGER seconds."""
        return bool(self._waiters) or time.monotonic() - self._last_used <= LINGER

    def _take_turn_for_keeper(self) -> bool:
        """The keeper reads only when no thread wants to and someone needs it: asyncio waiters,
        or connections to close. (Threads read for themselves when they wait; between two
        waits, and while the inbox lingers, notices keep in the connections' buffers.)"""
        with self._guard:
            if self._reader is not None or self._standby:
                return False
            if not self._asynchronous and (self._wanted() or not self._connected()):
                return False
            self._reader = _KEEPER
            return True

    def _connected(self) -> bool:
        return any(inbox.conn is not None for inbox in self._inboxes)

    def _connect_missing(self) -> None:
        """A connection subscribed to our inbox on every master that has none (see ``Inbox``)."""
        for inbox in self._inboxes:
            if inbox.due(time.monotonic()) and not self.closed and inbox.subscribe(self.inbox):
                self._ring()  # the reader watches it from now on

    def _disconnect_all(self) -> None:
        for inbox in self._inboxes:
            inbox.drop(inbox.conn, retry_later=False)


_HUBS: weakref.WeakSet[ReleaseNotices] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The parent's waiters do not exist in the child.
    for hub in list(_HUBS):
        hub._new_process()  # noqa: SLF001 (this module's own hook)


os.register_at_fork(after_in_child=_after_fork_in_child)
