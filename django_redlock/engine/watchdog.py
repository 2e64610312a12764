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

from . import procedures
from .drivers import run
from .errors import LockLost
from .events import logger
from .leases import Lease
from .steps import Masters

#: Renew when this fraction of the TTL has passed since the last renewal.
RENEW_AT = 1 / 3


class Watchdog:
    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, weakref.ref[Lease], int | None, float | None]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, lease: Lease, max_extensions: int | None, max_hold: float | None) -> None:
        """Renew ``lease`` until released, lost, dropped, or a cap is reached."""
        with self._cond:
            self._push(time.monotonic() + lease.ttl * RENEW_AT, lease, max_extensions, max_hold)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="redlock-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    @property
    def watching(self) -> int:
        """How many leases are scheduled (some may be released and not yet swept)."""
        with self._cond:
            return len(self._due)

    def _push(
        self, when: float, lease: Lease, max_extensions: int | None, max_hold: float | None
    ) -> None:
        entry = (when, next(self._order), weakref.ref(lease), max_extensions, max_hold)
        heapq.heappush(self._due, entry)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._due or self._due[0][0] > time.monotonic():
                    timeout = self._due[0][0] - time.monotonic() if self._due else None
                    self._cond.wait(timeout)
                _, _, ref, max_extensions, max_hold = heapq.heappop(self._due)
            lease = ref()
            if lease is None or lease.released or lease.lost:
                continue
            next_at = self._renew(lease, max_extensions, max_hold)
            if next_at is not None:
                with self._cond:
                    self._push(next_at, lease, max_extensions, max_hold)

    def _renew(
        self, lease: Lease, max_extensions: int | None, max_hold: float | None
    ) -> float | None:
        """Renew once; return when to look at the lease next, or None to stop watching it."""
        handle = lease.handle()
        if handle is None:
            return None
        masters: Masters = handle._redlock  # noqa: SLF001 (the engine's own handle)
        capped = (max_extensions is not None and lease.extensions >= max_extensions) or (
            max_hold is not None and time.monotonic() - lease.acquired_at >= max_hold
        )
        if capped:
            # Stop renewing; look again when the lease runs out, to report it lost at once.
            return lease.valid_until if not lease.check_lost() else None
        try:
            validity = run(masters, procedures.extend(masters, lease, once=True))
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


#: The process's watchdog, shared by every Redlock.
WATCHDOG = Watchdog()
