"""One renewal thread per process for every auto-extended lease, sync or async.

Each lease is renewed at about a third of its TTL by a quorum extend. A failed round is retried
soon, while validity lasts; when it runs out (or the masters say our key is gone) the lease is
marked lost, which fires ``on_lost`` and the ``lost`` event at once, from this thread.

Why a thread for async locks too: renewal must not depend on the event loop being responsive
(a loop blocked by CPU work is exactly when a lease would silently expire), and one renewal path
is simpler to trust than two. The thread uses its own sync connections.

The watchdog holds leases weakly: a released lease is skipped, a dropped one (its handle garbage-
collected) vanishes. After ``fork()`` the child starts with an empty watchdog: it never renews the
parent's locks.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
import weakref

from . import holding
from .drivers import run
from .errors import LockLost
from .events import logger
from .leases import Lease
from .steps import Masters

#: Renew when this fraction of the TTL has passed since the last renewal.
RENEW_AT = 1 / 3

#: Leases falling due within this much of each other are looked at in one wake-up (a renewal at a
#: third of the TTL, or an expiry notice, does not need better than that).
SLACK = 0.005

#: The schedule is swept of released leases once it holds this many entries, then whenever it
#: has doubled since: a released lease's expiry look would otherwise stay until its TTL (with a
#: thousand short locks a second and a 30 s TTL, thirty thousand dead entries).
SWEEP_AT = 1024

#: One scheduled look at a lease: (when, order, lease, renew it?, max_extensions, max_hold).
Entry = tuple[float, int, weakref.ref[Lease], bool, int | None, float | None]


class Watchdog:
    """One thread per process: renews auto-extended leases, and tells when any other lease
    runs out unreleased (its ``on_lost`` and the ``lost`` event fire then, not only when
    something touches the lock)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: list[Entry] = []
        self._order = itertools.count()
        self._sweep_at = SWEEP_AT
        self._thread: threading.Thread | None = None

    def watch(self, lease: Lease, max_extensions: int | None, max_hold: float | None) -> None:
        """Renew ``lease`` until released, lost, dropped, or a cap is reached."""
        self._schedule(
            time.monotonic() + lease.ttl * RENEW_AT, lease, True, max_extensions, max_hold
        )

    def watch_expiry(self, lease: Lease) -> None:
        """Mark ``lease`` lost (and tell) when it runs out, unless released before."""
        self._schedule(lease.valid_until, lease, False, None, None)

    @property
    def watching(self) -> int:
        """How many leases are scheduled (some may be released and not yet swept)."""
        with self._cond:
            return len(self._due)

    def _schedule(
        self,
        when: float,
        lease: Lease,
        renew: bool,
        max_extensions: int | None,
        max_hold: float | None,
    ) -> None:
        entry = (when, next(self._order), weakref.ref(lease), renew, max_extensions, max_hold)
        with self._cond:
            heapq.heappush(self._due, entry)
            if len(self._due) >= self._sweep_at:
                self._due = [e for e in self._due if _pending(e)]
                heapq.heapify(self._due)
                self._sweep_at = max(SWEEP_AT, 2 * len(self._due))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redlock-watchdog", daemon=True
                )
                self._thread.start()
            if self._due[0] is entry:  # earlier than what the thread sleeps for
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    timeout = self._due[0][0] - time.monotonic() + SLACK if self._due else None
                    self._cond.wait(timeout)
                now = time.monotonic()
                entries = []
                while self._due and self._due[0][0] <= now + SLACK:
                    entries.append(heapq.heappop(self._due))
            for _, _, ref, renew, max_extensions, max_hold in entries:
                lease = ref()
                if lease is None or lease.released or lease.lost:
                    continue
                if not renew:
                    self._expire(lease)
                    continue
                next_at = self._renew(lease, max_extensions, max_hold)
                if next_at is not None:
                    self._schedule(next_at, lease, True, max_extensions, max_hold)

    def _expire(self, lease: Lease) -> None:
        if not lease.check_lost():  # extended meanwhile (by hand): look again when it runs out
            self._schedule(lease.valid_until, lease, False, None, None)

    def _renew(
        self, lease: Lease, max_extensions: int | None, max_hold: float | None
    ) -> float | None:
        """Renew once; return when to look at the lease next, or None to stop watching it."""
        handle = lease.handle()
        if handle is None:
            return None
        masters: Masters = handle._redlock  # noqa: SLF001 (the engine's own handle)
        capped = max_extensions is not None and lease.extensions >= max_extensions
        if max_hold is not None:
            left = lease.acquired_at + max_hold - time.monotonic()
            if left <= lease.ttl:
                capped = True
                if left > lease.validity + SLACK:
                    # The last renewal reaches the cap exactly (``at_most``), not a TTL past it.
                    try:
                        run(masters, holding.extend(masters, lease, once=True, ttl=left))
                    except LockLost:
                        return None
                    except Exception:  # noqa: BLE001 (as below)
                        logger.exception("auto-extend of %r failed", lease.resource)
        if capped:
            # Stop renewing; look again when the lease runs out, to report it lost at once.
            if not lease.check_lost():
                self.watch_expiry(lease)
            return None
        try:
            validity = run(masters, holding.extend(masters, lease, once=True))
        except LockLost:
            return None  # marked lost (event and on_lost fired) by the extend procedure
        except Exception:  # noqa: BLE001 (the watchdog must outlive any one lease's bug)
            logger.exception("auto-extend of %r failed", lease.resource)
            validity = 0.0
        now = time.monotonic()
        if validity > 0:
            return now + lease.ttl * RENEW_AT
        # This round failed but the lease is still valid: try again soon, before it runs out.
        return min(now + masters.retry_delay, lease.valid_until)


def _pending(entry: Entry) -> bool:
    lease = entry[2]()
    return lease is not None and not lease.released and not lease.lost


#: The process's watchdog, shared by every Redlock.
WATCHDOG = Watchdog()
