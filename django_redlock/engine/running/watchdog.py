"""One renewal thread per process for every auto-extended lease, sync or async, and the expiry
notice of every other lease someone listens to.

Each lease is renewed at about a third of its TTL by a quorum extend. A failed round is retried
soon, while validity lasts; when it runs out (or the masters say our key is gone) the lease is
marked lost, and ``on_lost`` and the ``lost`` event are told, on the callbacks' thread
(``callbacks``): a slow callback never holds back a renewal.

How it scales: the thread runs an asyncio event loop of its own, and every lease that falls due
is renewed by a task of its own through the async driver (``drivers.arun``), all at once, on
that loop's pipelined connections (one per master): requests written in one loop tick leave in
one write, and a master 40 ms away costs each renewal 40 ms, not each renewal after the one
before it. Ten thousand leases due together cost one burst of requests per master, not ten
thousand round trips end to end (as one thread renewing in turn did). A pool of threads would
bound the renewals in flight by its size and cost a thread and a wait per round; tasks cost a
few microseconds each, and the pipes are the ones ``aacquire()`` already uses.

Why a thread of its own, for async locks too: renewal must not depend on the user's event loop
being responsive (a loop blocked by CPU work is exactly when a lease would silently expire), nor
on the user's threads; and one renewal path is simpler to trust than two. The loop is private:
nothing but renewals and expiry looks runs on it.

The schedule: an entry per look at a lease (its renewal, or its expiry notice), in a heap. Each
lease has one live entry: an ``extend()`` by the holder reschedules it (``reschedule``: a
renewal at a third of the new TTL, or the notice at the new deadline), and entries of an older
schedule are dropped when they fall due (or swept earlier).

Expiry notices start in a plain list, not the heap (``watch_expiry``): most such leases are
released long before they run out, and a heap entry made for each (a push under the lock, a
wake-up check) cost every ``with redlock(r):`` of a project with signals or metrics about 8,000
instructions, the list's append about a quarter of that. The thread moves the list's live
leases into the heap when the first of them falls due (it sleeps until then at the latest), so
a lease that runs out unreleased is still noticed at its deadline; released ones are dropped
there, or swept from the list when it grows (as the heap is).

The watchdog holds leases weakly: a released lease is skipped, a dropped one (its handle garbage-
collected) vanishes. After ``fork()`` the child starts with an empty watchdog: it never renews the
parent's locks.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import threading
import time
import weakref

from ..algorithm import holding
from ..base.errors import ExtensionLimit, LockLost
from ..base.events import logger
from ..leases.callbacks import DISPATCHER
from ..leases.leases import Lease
from .drivers import arun

#: Renew when this fraction of the TTL has passed since the last renewal (or the acquisition)
#: began: counted from the lease's deadline, not from when the last round ended, so that rounds
#: slowed by a crowd (ten thousand acquisitions at once, a wave of renewals) do not push the
#: next renewal towards the end of the lease.
RENEW_AT = 1 / 3

#: Leases falling due within this much of each other are looked at in one wake-up (a renewal at a
#: third of the TTL, or an expiry notice, does not need better than that).
SLACK = 0.005

#: The schedule is swept of released leases once it holds this many entries, then whenever it
#: has doubled since: a released lease's expiry look would otherwise stay until its TTL (with a
#: thousand short locks a second and a 30 s TTL, thirty thousand dead entries).
SWEEP_AT = 1024

#: One scheduled look at a lease: (when, order, lease, the lease's schedule it belongs to).
Entry = tuple[float, int, weakref.ref[Lease], int]

#: A lease whose expiry is watched, not yet in the heap (in its first schedule, 0: one
#: rescheduled since, by an extend, has its live look in the heap already).
Fresh = weakref.ref[Lease]

_NEVER = float("inf")


class Watchdog:
    """One thread per process: renews auto-extended leases, and tells when any other lease
    runs out unreleased (its ``on_lost`` and the ``lost`` event fire then, not only when
    something touches the lock)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._guard = threading.Lock()
        self._due: list[Entry] = []
        self._order = itertools.count()
        self._sweep_at = SWEEP_AT
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: What the loop sleeps on while nothing is due; None once a wake-up was asked for.
        self._sleeping: asyncio.Future[None] | None = None
        #: Until when it sleeps (at the latest), set with ``_sleeping``.
        self._wake_at = _NEVER
        #: Expiry notices not yet in the heap, the earliest deadline among them (when the loop
        #: moves them there), and the length at which the list is next swept.
        self._fresh: list[Fresh] = []
        self._fresh_due = _NEVER
        self._fresh_sweep_at = SWEEP_AT
        self._renewing: set[asyncio.Task[None]] = set()

    def watch(self, lease: Lease) -> None:
        """Renew ``lease`` until released, lost, dropped, or a cap is reached."""
        lease.auto_extend = True
        lease.watcher = self
        self._push(_renewal_due(lease), lease, lease.schedule)

    def watch_expiry(self, lease: Lease, ref: weakref.ref[Lease] | None = None) -> None:
        """Mark ``lease``, just acquired (its first schedule), lost (and tell) when it runs out,
        unless released before; ``ref``: its weak reference, if the caller made it already."""
        lease.watcher = self
        fresh = ref or weakref.ref(lease)
        until = lease.valid_until
        guard = self._guard
        guard.acquire()  # (not ``with``: this is on every acquisition someone listens to)
        try:
            waiting = self._fresh
            waiting.append(fresh)
            if len(waiting) >= self._fresh_sweep_at:
                waiting[:] = [f for f in waiting if _live(f())]
                self._fresh_sweep_at = max(SWEEP_AT, 2 * len(waiting))
            if until < self._fresh_due:
                self._fresh_due = until
                if self._thread is None:
                    self._start()
                elif until < self._wake_at:
                    self._wake()
        finally:
            guard.release()

    def reschedule(self, lease: Lease) -> None:
        """The holder is extending ``lease`` (a new TTL may shorten it): renew it at a third of
        its TTL from now, or look for its expiry at its deadline; earlier looks are dropped."""
        with self._guard:
            lease.schedule += 1
        if lease.auto_extend:
            when = time.monotonic() + lease.ttl * RENEW_AT
        else:
            when = lease.valid_until
        self._push(when, lease, lease.schedule)

    @property
    def watching(self) -> int:
        """How many looks are scheduled (some may be for released leases not yet swept)."""
        with self._guard:
            return len(self._due) + len(self._fresh)

    def _push(self, when: float, lease: Lease, schedule: int) -> None:
        """Schedule a look at ``lease`` at ``when``, if ``schedule`` is still its live one."""
        entry = (when, next(self._order), weakref.ref(lease), schedule)
        with self._guard:
            if lease.schedule != schedule:
                return  # rescheduled meanwhile: that look is the live one
            heapq.heappush(self._due, entry)
            if len(self._due) >= self._sweep_at:
                self._due = [e for e in self._due if _pending(e)]
                heapq.heapify(self._due)
                self._sweep_at = max(SWEEP_AT, 2 * len(self._due))
            if self._thread is None:
                self._start()
            elif self._due[0] is entry and when < self._wake_at:
                self._wake()

    def ready(self) -> None:
        """Start the thread now, if it is not running: for a process that begins to wait for a
        lock (a waiter, ``Listen``), which has the time, so that the thread's start (~1 ms on a
        busy 2-CPU machine) falls on its wait and not between the release that hands it the
        lock and its holding it (the first lease it holds would start it then)."""
        if self._thread is None:
            with self._guard:
                if self._thread is None:
                    self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="redlock-watchdog", daemon=True)
        self._thread.start()

    def _wake(self) -> None:
        """Wake the loop (once), which sleeps past a look just scheduled. Under ``_guard``."""
        sleeping, self._sleeping = self._sleeping, None
        if sleeping is None:
            return  # awake, or already asked to wake: it reads the schedule before sleeping
        if threading.current_thread() is self._thread:
            _settle(sleeping)
        else:
            assert self._loop is not None  # noqa: S101 (set before it sleeps)
            self._loop.call_soon_threadsafe(_settle, sleeping)

    # --- the watchdog's thread -------------------------------------------------------------------

    def _run(self) -> None:
        DISPATCHER.defer_here()
        loop = asyncio.new_event_loop()
        self._loop = loop
        while True:  # a bug of ours must not end every renewal of the process for good
            try:
                loop.run_until_complete(self._serve(loop))
            except Exception:  # noqa: BLE001
                logger.exception("the watchdog's loop failed; restarting it")
                time.sleep(SLACK)

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            with self._guard:
                now = time.monotonic()
                entries = []
                while self._due and self._due[0][0] <= now + SLACK:
                    entries.append(heapq.heappop(self._due))
                fresh: list[Fresh] = []
                if self._fresh_due <= now + SLACK:  # the first of them falls due: all to the heap
                    fresh, self._fresh = self._fresh, []
                    self._fresh_due, self._fresh_sweep_at = _NEVER, SWEEP_AT
                if not entries and not fresh:
                    sleeping = self._sleeping = loop.create_future()
                    until = min(self._due[0][0] if self._due else _NEVER, self._fresh_due)
                    self._wake_at = until
                    wait = None if until == _NEVER else until - now + SLACK
            for ref in fresh:
                lease = ref()
                if _live(lease):
                    assert lease is not None  # noqa: S101 (for the type checker)
                    self._push(lease.valid_until, lease, 0)
            if entries or fresh:
                for entry in entries:
                    try:
                        self._look(loop, entry)
                    except Exception:  # noqa: BLE001 (the watchdog must outlive any one lease)
                        logger.exception("the watchdog failed to look at a lease")
                continue
            timer = None if wait is None else loop.call_later(wait, _settle, sleeping)
            await sleeping
            if timer is not None:
                timer.cancel()

    def _look(self, loop: asyncio.AbstractEventLoop, entry: Entry) -> None:
        _, _, ref, schedule = entry
        lease = ref()
        if lease is None or lease.released or lease.lost or lease.schedule != schedule:
            return
        if not lease.auto_extend:
            if not lease.check_lost():  # extended meanwhile: look again when it runs out
                self._push(lease.valid_until, lease, schedule)
            return
        task = loop.create_task(self._renew(lease, schedule))
        self._renewing.add(task)
        task.add_done_callback(self._renewing.discard)

    async def _renew(self, lease: Lease, schedule: int) -> None:
        """Renew once, then schedule the next look (unless the holder rescheduled meanwhile)."""
        handle = lease.handle()
        if handle is None:
            return
        masters = handle._redlock  # noqa: SLF001 (the engine's own handle)
        del handle  # (not kept alive by a round in flight)
        if lease.max_hold is not None:
            left = lease.acquired_at + lease.max_hold - time.monotonic()
            if left <= lease.ttl:
                if left > lease.validity + SLACK:
                    # The last renewal reaches the cap exactly (``at_most``), not a TTL past it.
                    try:
                        await arun(masters, holding.extend(masters, lease, once=True, ttl=left))
                    except LockLost:
                        return  # marked lost (and told) by the extend procedure
                    except ExtensionLimit:
                        pass
                    except Exception:  # noqa: BLE001 (as below)
                        logger.exception("auto-extend of %r failed", lease.resource)
                self._stop_renewing(lease, schedule)
                return
        try:
            validity = await arun(masters, holding.extend(masters, lease, once=True))
        except ExtensionLimit:
            self._stop_renewing(lease, schedule)
            return
        except LockLost:
            return  # marked lost (and told) by the extend procedure
        except Exception:  # noqa: BLE001 (the watchdog must outlive any one lease's bug)
            logger.exception("auto-extend of %r failed", lease.resource)
            validity = 0.0
        now = time.monotonic()
        if validity > 0:
            self._push(max(_renewal_due(lease), now + SLACK), lease, schedule)
        else:
            # This round failed but the lease is still valid: try again soon, before it runs out.
            self._push(min(now + masters.retry_delay, lease.valid_until), lease, schedule)

    def _stop_renewing(self, lease: Lease, schedule: int) -> None:
        """A cap is reached: no more renewals; look again when the lease runs out, to report it
        lost at once."""
        lease.auto_extend = False
        if not lease.check_lost():
            self._push(lease.valid_until, lease, schedule)


def _renewal_due(lease: Lease) -> float:
    """When a third of the lease's TTL has passed since it began (it is ours until its start +
    TTL - drift)."""
    return lease.valid_until - lease.ttl * (1 - RENEW_AT)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _pending(entry: Entry) -> bool:
    lease = entry[2]()
    return _live(lease) and lease.schedule == entry[3]  # type: ignore[union-attr]


def _live(lease: Lease | None) -> bool:
    """Still to be looked at: not dropped, released or lost."""
    return lease is not None and not lease.released and not lease.lost


#: The process's watchdog, shared by every Redlock.
WATCHDOG = Watchdog()
