"""Reading the masters' words for ``notices.ReleaseNotices``: the holder of the reading turn
polls every master's inbox connection at once, reads each that has something, and acts on what
it says (a release's notice to one of our waiters, or our subscription confirmed). Its own
module: the reading is the hand-off's hot path (every master's word of every hand-off passes
here), the hub's turn-taking and keeper thread are not."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from ..members.quarantine import abstains
from ..scripts.plain import SEVERAL_MARK
from .inboxes import Inbox
from .waiter import Waiter

_SEVERAL = SEVERAL_MARK.encode()

#: An inbox's socket (None while unconnected): mapped in C, not by a generator's frames.
_SOCKET = attrgetter("sock")


class NoticeReading:
    """The reading part of ``ReleaseNotices`` (its base): what it reads with is the hub's."""

    quorum: int
    inbox: str
    closed: bool
    _guard: threading.Lock
    _reader: object  # who holds the reading turn: a waiting thread's beacon, the keeper, None
    _inboxes: list[Inbox]
    _waiters: dict[bytes, Waiter]
    _heard: dict[bytes, bytes]
    _bell: tuple[socket.socket, ...]
    _keeper_wake: threading.Event
    _polled: list[socket.socket | None]
    _polling: tuple[select.poll, dict[int, Inbox]]

    def _confirmations(self) -> int:
        return sum(inbox.confirmed for inbox in self._inboxes)

    def _read(
        self,
        done: Callable[[], bool],
        until: float,
        reads_until: Callable[[], float] | None = None,
        enough: Callable[[], bool] | None = None,
    ) -> None:
        """Deliver what the masters send until ``done()``, ``until`` (monotonic; or earlier, as
        ``reads_until()`` says meanwhile) or close; only the holder of the reading turn calls
        this. All the connections that poll found readable are read before ``done`` is asked
        again (a release's words from several masters come together), unless ``enough()``
        says after one of them that what the others have can wait."""
        bell = self._bell[1]
        while not done() and not self.closed:
            left = (until if reads_until is None else min(until, reads_until())) - time.monotonic()
            if left <= 0 or bell.fileno() < 0:  # (closed meanwhile: the keeper closed the bell)
                return
            poller, watched = self._poller()
            for fd, _ in poller.poll(left * 1000):
                inbox = watched.get(fd)
                if inbox is None:  # the bell
                    try:
                        bell.recv(4096)
                    except OSError:
                        pass
                    continue
                messages = inbox.messages()
                if messages:
                    self._take(inbox, messages)
                if inbox.conn is None:
                    self._keeper_wake.set()  # it broke: to connect again
                if enough is not None and enough():
                    return

    def _poller(self) -> tuple[select.poll, dict[int, Inbox]]:
        """A poll object on the bell and every open inbox connection, made anew only when those
        changed (only the holder of the reading turn calls this, so one at a time)."""
        sockets = [self._bell[1], *map(_SOCKET, self._inboxes)]
        if sockets != self._polled:
            poller = select.poll()
            watched: dict[int, Inbox] = {}
            for sock, inbox in zip(sockets, (None, *self._inboxes), strict=True):
                if sock is not None:
                    poller.register(sock, select.POLLIN)
                    if inbox is not None:
                        watched[sock.fileno()] = inbox
            self._polling, self._polled = (poller, watched), sockets
        return self._polling

    def _take(self, inbox: Inbox, messages: list[Any]) -> None:
        """Act on what one master sent: release notices (``deliver``), and the confirmation of
        our SUBSCRIBE."""
        for kind, channel, data in messages:
            if kind == b"message":
                self.deliver(data, inbox)
            elif kind == b"subscribe" and channel.decode() == self.inbox:
                inbox.confirmed = True
                with self._guard:
                    waiters = (
                        list(self._waiters.values()) if self._confirmations() >= self.quorum else []
                    )
                for waiter in waiters:
                    waiter.subscribed.fire()

    def deliver(self, notice: bytes, inbox: Inbox) -> None:
        """``<digest> <waiter id>[ +]``, from ``inbox``'s master: wake that waiter, once per
        release (every master sends it), and again when a master that handed it the lock (`` +``,
        and its word counts: ``Inbox.votes``, and it does not abstain) makes a quorum. (Waking at
        the first word, not only at a quorum: queues that disagree can split a release's keys among
        waiters so that none has a quorum, and then each must find out soon, by a round; see
        ``handed_over``.) The id may carry the mark of a waiter for several resources. (The
        reader's hot path: every master's word of every hand-off passes here, and the waiter it
        names holds the lock once it is through.)"""
        try:
            digest, named, *handed = notice.split(b" ")
        except ValueError:  # not ours (anyone may publish on the channel): nothing to wake
            return
        if named.endswith(_SEVERAL):
            named = named[: -len(_SEVERAL)]
        with self._guard:
            waiter = self._waiters.get(named)
            if waiter is None:
                return
            heard = self._heard
            wake = heard.get(named) != digest  # (a release's first word to it)
            heard[named] = digest
            if handed and inbox.votes and not abstains(inbox.node):
                to_quorum = waiter.handed
                if wake or not to_quorum:  # (its quorum's budget runs from here)
                    waiter.first_handed = time.monotonic()
                to_quorum.add(inbox.node)
                wake = wake or len(to_quorum) == self.quorum
        if wake:
            beacon = waiter.notified
            if beacon is self._reader:  # the waiter's own thread reads: awake, not asleep on it
                beacon.fire_awake()
            else:
                beacon.fire()
