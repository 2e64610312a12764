"""Admission control: at most ``IN_FLIGHT`` rounds of one process (per event loop, and for its
threads) are on the masters at once; further acquisitions wait here, in arrival order.

Why: a round's node budget runs from when its request is written. Written all at once, twenty
thousand requests would queue on each master behind one another (and behind our own unread
replies), and the last of them would miss their budget on healthy masters: our own queueing
charged to them as silence, acquisitions failed with ``QuorumUnavailable``, releases left
unconfirmed. Waiting *here* instead costs only the caller's patience: the masters see at most
``IN_FLIGHT`` of our requests at a time, each answered well within its budget, and a caller
whose turn cannot come within its patience is told so (``Overloaded``, with the queue's length)
rather than given an error that blames the masters.

A holder's rounds (release, extend, clean-up) wait too, without a limit, and ahead of every
waiting acquisition: a lease's clock runs while they wait. But a holder's release or renewal
lets the acquisitions queued before it go first for a while (its ``behind``: a tenth of what is
left of its lease, ``holder_patience``), so that it never waits long next to its lease either:
always ahead, a burst's last acquisitions waited behind nearly every release of the burst
(1,000 tasks holding 20 ms each: p99 ~200 ms, about half that in arrival order).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from typing import Any, TypeVar

from ..base import deadlines, process
from ..base.loops import of_loop

#: Rounds of one event loop (or of one process's threads) on the masters at once. Enough to keep
#: every master busy (a pipeline of a few hundred requests), few enough that the last of them is
#: answered within a millisecond or two of the first on a healthy master.
IN_FLIGHT = 256

#: How long an acquisition with ``wait=0`` (one attempt: no patience of its own for a holder)
#: may wait for its turn here before it is refused as ``Overloaded``. An acquisition with a
#: ``wait`` waits at most what is left of it.
PATIENCE = 60.0

#: A holder's release or renewal lets the acquisitions queued before it go first for at most
#: this share of what is left of its lease (``holder_patience``), and at most HOLDER_PATIENCE.
LEASE_SHARE = 0.1
HOLDER_PATIENCE = 1.0

#: The queue's pace is measured over windows of at least this long while it is not empty.
_PACE_WINDOW = 0.1

#: A caller is refused at once only if its turn is expected this many times later than its
#: patience allows (the pace is an estimate: one between is let wait, and refused after its
#: patience if its turn does not come).
_SURE = 2.0


class Full(Exception):  # noqa: N818 (a signal to the procedure, which raises Overloaded)
    """No turn within the caller's patience: ``queued`` rounds were ahead, ``expected`` is the
    wait their pace promised (0.0 if it was not known yet: then it was actually waited).
    ``ran_out``: the caller's wait was over before it came to the queue (it spent it earlier:
    a busy machine, a slow caller), so it was refused whatever the pace."""

    def __init__(
        self, queued: int, expected: float, waited: float, *, ran_out: bool = False
    ) -> None:
        super().__init__(queued, expected, waited)
        self.queued = queued
        self.expected = expected
        self.waited = waited
        self.ran_out = ran_out


class _Pace:
    """How long one turn takes while there is a queue (seconds per round admitted from it)."""

    __slots__ = ("_mark", "_mark_served", "per_turn", "served")

    def __init__(self) -> None:
        self.per_turn = 0.0  # unknown yet
        self.served = 0
        self._mark = 0.0
        self._mark_served = 0

    def queue_formed(self) -> None:
        # Measured afresh for each queue (a previous burst's pace says little about this one),
        # from the first turn it gives (not from a cold start).
        self.per_turn = 0.0
        self._mark = 0.0

    def turn_given(self, now: float) -> None:
        self.served += 1
        if not self._mark:
            self._mark, self._mark_served = now, self.served
        elif now - self._mark >= _PACE_WINDOW:
            measured = (now - self._mark) / (self.served - self._mark_served)
            self.per_turn = measured if not self.per_turn else (self.per_turn + measured) / 2
            self._mark, self._mark_served = now, self.served

    def expected(self, queued: int) -> float:
        return queued * self.per_turn

    def refuse_at_once(self, queued: int, expected: float, patience: float | None) -> None:
        """Raise ``Full`` if a turn ``expected`` seconds away (``queued`` ahead) is surely beyond
        ``patience``: always so when the patience is spent already (``ran_out``)."""
        if patience is not None and expected > _SURE * patience:
            raise Full(queued, expected, 0.0, ran_out=patience <= 0)


#: A round's place in a loop's line: when it came, its turn to come, and (for ``Full``) how many
#: rounds were ahead of it then and the wait their pace promised.
Place = tuple[float, "asyncio.Future[None]", int, float]


class LoopGate:
    """The admission of one event loop's rounds (its futures are the waiters)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: int = IN_FLIGHT) -> None:
        self.loop = loop
        self.limit = limit
        self.in_flight = 0
        self.holders: deque[Place] = deque()
        self.waiting: deque[Place] = deque()  # acquisitions
        self.urgent_at = _NEVER  # when a queued holder's round goes ahead of every acquisition
        self.pace = _Pace()

    def queued(self) -> int:
        return len(self.holders) + len(self.waiting)

    def enter_at_once(self) -> bool:
        """Take a turn if one is free and no round waits for one (no coroutine, no future: the
        usual case); False if the round must ``enter``."""
        if self.in_flight < self.limit and not self.holders and not self.waiting:
            self.in_flight += 1
            return True
        return False

    async def enter(self, patience: float | None, behind: float = 0.0) -> None:
        """Wait for a turn (FIFO) at most ``patience`` seconds, else ``Full``; None: a holder's
        round, which waits as long as it takes, ahead of every acquisition but those queued
        before it, for ``behind`` seconds at most. (The async driver does the same inline,
        without this coroutine: ``enter_at_once``, else ``queue``, awaited, and ``gave_up``.)"""
        if self.enter_at_once():
            return
        place = self.queue(patience, behind)
        try:
            await place[1]
        except Full:
            raise self.refused(place) from None
        except BaseException:
            self.gave_up(place)
            raise

    def queue(self, patience: float | None, behind: float = 0.0) -> Place:
        """(No turn was free: ``enter_at_once``.) The round's place in line, as ``enter`` says:
        its future (``place[1]``) gets the turn, or ``Full`` once ``patience`` has passed;
        ``Full`` at once if the queue's pace says its turn cannot come within ``patience``.
        Whoever awaits it turns a ``Full`` into ``refused(place)``, and calls ``gave_up(place)``
        if the wait ends in any other exception (cancelled)."""
        queued = self.queued() if patience is not None else len(self.holders)
        expected = self.pace.expected(queued)
        self.pace.refuse_at_once(queued, expected, patience)
        if not self.queued():
            self.pace.queue_formed()
        began = time.monotonic()
        turn = self.loop.create_future()
        # (What ``Full`` would say is kept with its place: no object more per queued round.)
        place = (began, turn, queued, expected)
        if patience is None:
            self.holders.append(place)
            self.urgent_at = min(self.urgent_at, began + behind)
        else:
            self.waiting.append(place)
            # (One timer per loop for every patience: ``deadlines``.)
            deadlines.of(self.loop).call_at(began + max(patience, 0.0), _expire, turn)
        return place

    @staticmethod
    def refused(place: Place) -> Full:
        """The ``Full`` of a place whose patience ran out: what was ahead of it when it came,
        and how long it waited."""
        began, _, queued, expected = place
        return Full(queued, expected, time.monotonic() - began)

    def gave_up(self, place: Place) -> None:
        """The wait for ``place`` ended in an exception other than its refusal: a turn handed
        to it just before (then a cancellation) is given on. (``exception()`` also marks an
        expiry that came with a cancellation as seen.)"""
        turn = place[1]
        if turn.done() and not turn.cancelled() and turn.exception() is None:
            self.leave()

    def leave(self) -> None:
        """A round is done: its turn goes to the next round waiting (``next_queue``) that is
        still waiting."""
        if not self.holders and not self.waiting:  # nobody queued (the usual case)
            self.in_flight -= 1
            return
        now = time.monotonic()
        while (queue := next_queue(self.holders, self.waiting, now, self.urgent_at)) is not None:
            turn = queue.popleft()[1]
            if not self.holders:
                self.urgent_at = _NEVER
            if not turn.done():
                turn.set_result(None)
                self.pace.turn_given(now)
                return
        self.in_flight -= 1


_NEVER = float("inf")

#: A line's entries: when each came first, then its turn (and anything else).
Entry = TypeVar("Entry", bound=tuple[Any, ...])


def next_queue(
    holders: deque[Entry], waiting: deque[Entry], now: float, urgent_at: float
) -> deque[Entry] | None:
    """The queue whose first round has the next turn: the one that arrived first; the holders'
    from ``urgent_at`` on (the earliest time one of them goes ahead of every acquisition); None
    if both are empty."""
    if not holders or not waiting:
        return holders or waiting or None
    return holders if holders[0][0] <= waiting[0][0] or now >= urgent_at else waiting


def holder_patience(valid_until: float) -> float:
    """How long a holder's round for a lease valid until ``valid_until`` (monotonic) lets the
    acquisitions queued before it go first: a tenth of what is left of the lease (it still
    reaches the masters well within it), at most HOLDER_PATIENCE."""
    share = (valid_until - time.monotonic()) * LEASE_SHARE
    # (Not min(HOLDER_PATIENCE, max(0.0, share)): saves 2.4k instructions a release, 0.6% of a
    # ``with redlock(r)`` cycle; kept for issue 37's budget.)
    if share <= 0.0:
        return 0.0
    return share if share < HOLDER_PATIENCE else HOLDER_PATIENCE


def _expire(turn: asyncio.Future[None]) -> None:
    """A place's patience ran out (its waiter makes the ``Full`` it raises: ``refused``)."""
    if not turn.done():
        turn.set_exception(Full(0, 0.0, 0.0))


class ThreadGate:
    """The admission of one process's threads (each waiter sleeps on an event of its own)."""

    def __init__(self, limit: int = IN_FLIGHT) -> None:
        self.limit = limit
        self.in_flight = 0
        self.holders: deque[tuple[float, threading.Event]] = deque()
        self.waiting: deque[tuple[float, threading.Event]] = deque()
        self.urgent_at = _NEVER
        self.pace = _Pace()
        self._lock = threading.Lock()

    def enter(self, patience: float | None, behind: float = 0.0) -> None:
        """As ``LoopGate.enter``, blocking."""
        # (Here and in ``leave``: acquire and release, not ``with``: saves 4.4k instructions a
        # cycle, 1.1%; kept for issue 37's budget.)
        lock = self._lock
        lock.acquire()
        try:
            if self.in_flight < self.limit and not self.holders and not self.waiting:
                self.in_flight += 1
                return
            queued = len(self.holders) + (len(self.waiting) if patience is not None else 0)
            expected = self.pace.expected(queued)
            self.pace.refuse_at_once(queued, expected, patience)
            if not self.holders and not self.waiting:
                self.pace.queue_formed()
            turn = threading.Event()
            began = time.monotonic()
            entry = (began, turn)
            if patience is None:
                self.holders.append(entry)
                self.urgent_at = min(self.urgent_at, began + behind)
            else:
                self.waiting.append(entry)
        finally:
            lock.release()
        if turn.wait(None if patience is None else max(patience, 0.0)):
            return
        with self._lock:
            if turn.is_set():
                return  # handed a turn just as the patience ran out: take it
            self.waiting.remove(entry)
        raise Full(queued, expected, time.monotonic() - began)

    def leave(self) -> None:
        lock = self._lock
        lock.acquire()
        try:
            if not self.holders and not self.waiting:  # nobody queued (the usual case)
                self.in_flight -= 1
                return
            now = time.monotonic()
            queue = next_queue(self.holders, self.waiting, now, self.urgent_at)
            if queue is not None:
                queue.popleft()[1].set()
                if not self.holders:
                    self.urgent_at = _NEVER
                self.pace.turn_given(now)
            else:
                self.in_flight -= 1
        finally:
            lock.release()


class Admission:
    """One engine's gates: one for its threads, one per event loop that uses it."""

    def __init__(self, limit: int = IN_FLIGHT) -> None:
        self.limit = limit
        self._pid = process.pid
        self._threads = ThreadGate(limit)
        self._loops: dict[asyncio.AbstractEventLoop, LoopGate] = {}

    def threads(self) -> ThreadGate:
        if self._pid != process.pid:
            # A forked child: its parent's rounds in flight are not its own.
            self._pid = process.pid
            self._threads = ThreadGate(self.limit)
            self._loops = {}
        return self._threads

    def of(self, loop: asyncio.AbstractEventLoop) -> LoopGate:
        self.threads()  # forgets the parent's gates in a forked child
        gate = self._loops.get(loop)  # (the usual case, without making a bound method)
        return gate if gate is not None else of_loop(self._loops, loop, self._new_gate)

    def _new_gate(self, loop: asyncio.AbstractEventLoop) -> LoopGate:
        return LoopGate(loop, self.limit)
