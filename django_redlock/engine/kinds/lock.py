"""The ``Lock`` handle: what a user holds, as a context manager, sync or async.

A handle may be shared (a module-level ``PAYMENTS = engine.lock("payments", wait=5)`` used by
many threads or tasks, as one would share a ``threading.Lock``): each caller that acquires through
it gets a lease of its own, and ``held``, ``validity``, ``lost``, ``fence``, ``check()``,
``extend()`` and ``release()`` speak of the calling thread's or task's lease only. A second
caller's ``acquire()`` competes like any other acquirer (it waits, or raises ``LockContended``);
it never overwrites the first one's lease. Owners are the task or thread objects themselves,
kept alive by their lease, never ids that Python reuses.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any

from ..algorithm import holding, markers, procedures
from ..algorithm.steps import Procedure
from ..base import renames
from ..base.errors import LockContended, LockLost, LockNotAcquired
from ..base.events import NullObserver, notify, notify_acquired, notify_released
from ..base.values import new_value
from ..handles import bounds
from ..handles.fields import Handle
from ..handles.granting import granted
from ..leases import reentry
from ..leases.leases import Lease, Owner, current_owner
from ..running.drivers import arun, run


class Lock(Handle):
    """A lock over the masters of a ``Redlock``: ``Redlock.lock()``, ``redlock()``. Its fields,
    and how they are checked when it is made: ``handles.Handle``."""

    __slots__ = ()

    def __repr__(self) -> str:
        lease = self._callers.get(current_owner())
        state = "unlocked" if lease is None else "lost" if lease.lost else "held"
        return f"<Lock {self.resource!r} {state}>"

    # --- what the holder can ask -----------------------------------------------------------------

    @property
    def held(self) -> bool:
        """Acquired by the calling thread/task, not released, and still within validity."""
        lease = self._callers.get(current_owner())
        return lease is not None and not lease.check_lost()

    @property
    def validity(self) -> float:
        """Seconds of guaranteed exclusivity left (0.0 when not held), on the monotonic clock."""
        lease = self._callers.get(current_owner())
        return 0.0 if lease is None or lease.lost else lease.validity

    @property
    def lost(self) -> bool:
        """True once the lease ran out, or the masters were found without our token, while we
        held it; still readable after ``release()`` (about the caller's last lease)."""
        owner = current_owner()
        lease = self._callers.get(owner)
        return lease.check_lost() if lease is not None else self._callers.was_lost(owner)

    @property
    def hold_count(self) -> int:
        """How many times the calling thread/task holds it (re-entrant locks: nested entries;
        0 when not held)."""
        lease = self._callers.get(current_owner())
        return 0 if lease is None or lease.released else lease.depth

    @property
    def fence(self) -> int:
        """The fencing token of this lease: an int that strictly increases per resource across
        all holders. Issued by a quorum the first time it is read (two rounds), then cached.
        In async code use ``await lock.afence()``; a lock over several resources has one per
        resource: ``lock.fences``."""
        fencing = holding.fence(self._redlock, *self._fenced("fence", current_owner()))
        return run(self._redlock, fencing)

    def afence(self) -> Coroutine[Any, Any, int]:
        return self._afence(current_owner())

    async def _afence(self, owner: Owner) -> int:
        fencing = holding.fence(self._redlock, *self._fenced("fence", owner))
        return await arun(self._redlock, fencing)

    @property
    def fences(self) -> dict[str, int]:
        """The fencing token of each resource (see ``fence``). Async: ``await lock.afences()``."""
        lease = self._held_lease("fence", current_owner())
        return {
            r: run(self._redlock, holding.fence(self._redlock, lease, r)) for r in self.resources
        }

    def afences(self) -> Coroutine[Any, Any, dict[str, int]]:
        return self._afences(current_owner())

    async def _afences(self, owner: Owner) -> dict[str, int]:
        lease, redlock = self._held_lease("fence", owner), self._redlock
        return {r: await arun(redlock, holding.fence(redlock, lease, r)) for r in self.resources}

    def owned(self) -> bool:
        """Ask the masters (one round): True only if a quorum still holds *our* lease and its
        validity is not over. Finding it gone marks it lost (``lost``, ``on_lost``)."""
        lease = self._callers.get(current_owner())
        if lease is None:
            return False
        return run(self._redlock, holding.holds(self._redlock, lease))

    def aowned(self) -> Coroutine[Any, Any, bool]:
        return self._aowned(current_owner())

    async def _aowned(self, owner: Owner) -> bool:
        lease = self._callers.get(owner)
        if lease is None:
            return False
        return await arun(self._redlock, holding.holds(self._redlock, lease))

    locked, alocked = renames.renamed("locked", owned), renames.renamed("alocked", aowned)

    def check(self) -> None:
        """Raise ``LockLost`` unless the lock is still held within its validity."""
        lease = self._held_lease("check", current_owner())
        if lease.check_lost():
            raise lease.lost_error()

    # --- sync API --------------------------------------------------------------------------------

    def acquire(self) -> Lock:
        """Acquire the lock, trying until ``wait`` runs out; raise ``LockContended`` or
        ``QuorumUnavailable`` if it cannot."""
        owner = current_owner()
        if not self._reenter(owner):
            want = self._want(owner)
            self._hold(owner, want, self._outcome(want))
        return self

    def extend(self, ttl: float | None = None) -> float:
        """Renew the lease on a quorum, for ``ttl`` seconds (the lock's TTL if None; a new one
        becomes the lease's TTL); returns the new validity in seconds. Retries until renewed or
        the lease runs out, then raises ``LockLost``. ``ExtensionLimit`` past ``max_extensions``
        (manual and automatic extensions count alike), and once ``at_most``/``max_hold`` is
        reached: before, a longer TTL is cut to end there."""
        lease, ttl = self._extendable(ttl, current_owner())
        return run(self._redlock, holding.extend(self._redlock, lease, once=False, ttl=ttl))

    def release(self) -> None:
        """Delete our key on every master (compare-and-delete: never another owner's). Raises
        ``LockLost``, after removing our lease wherever it still was, unless a quorum confirmed
        that it removed it: it had run out, or been released by force (exclusivity may have
        been broken: ``lost`` is true), or too few masters answered (``error.unconfirmed``: the
        lease was valid until now, and where it remains it expires within its TTL). A ``with``
        block raises only for the first two: its section was safe in the third."""
        self._release(current_owner())

    def _release(self, owner: Owner) -> None:
        lease = self._detach(owner)
        if lease is not None:
            try:
                kept = bounds.kept(self.at_least, lease)
                run(self._redlock, holding.let_go(self._redlock, lease, kept))
            finally:
                self._released(owner, lease)

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leave(current_owner(), exc)

    def _leave(self, owner: Owner, exc: BaseException | None) -> None:
        """``owner`` leaves its block (``exc``: what the block raised); also how a decorated
        generator ends its hold, whichever thread closes it."""
        ran_out = self._ran_out(owner)
        try:
            self._release(owner)
        except LockLost as error:
            if not error.unconfirmed:  # a release too few answered: the block itself was safe
                ran_out = error
        if ran_out is not None:
            _report_lost(ran_out, exc)

    # --- async API -------------------------------------------------------------------------------
    # The owner is the task that *calls* an async method, bound before the coroutine runs (every
    # one of them: ``aacquire``, ``arelease``, ``aextend``, ``aowned``, ``afence``,
    # ``afences``): ``asyncio.gather(lock.aowned())`` runs it in a task of its own, and so does
    # ``asyncio.wait_for(...)`` on Python 3.11, and the lease must still be the caller's.

    def aacquire(self) -> Coroutine[Any, Any, Lock]:
        return self._aacquire(current_owner())

    async def _aacquire(self, owner: Owner) -> Lock:
        if not self._reenter(owner):
            want = self._want(owner)
            self._hold(owner, want, await self._aoutcome(want))
        return self

    def aextend(self, ttl: float | None = None) -> Coroutine[Any, Any, float]:
        return self._aextend(current_owner(), ttl)

    async def _aextend(self, owner: Owner, ttl: float | None) -> float:
        lease, ttl = self._extendable(ttl, owner)
        extending = holding.extend(self._redlock, lease, once=False, ttl=ttl)
        return await arun(self._redlock, extending)

    def arelease(self) -> Coroutine[Any, Any, None]:
        return self._arelease(current_owner())

    async def _arelease(self, owner: Owner) -> None:
        lease = self._detach(owner)
        if lease is not None:
            releasing = holding.let_go(self._redlock, lease, bounds.kept(self.at_least, lease))
            try:  # (its round's turn comes first, then it is made: ``drivers.arun``)
                await arun(self._redlock, releasing, holder_until=lease.valid_until)
            finally:
                self._released(owner, lease)

    # Not ``async def``, here and in ``__aexit__``: they hand on the coroutine they make, one
    # coroutine less each (saves 2.5k instructions an ``async with`` cycle, callgrind).
    def __aenter__(self) -> Coroutine[Any, Any, Lock]:
        return self.aacquire()  # (through aacquire, which subclasses wrap)

    def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Coroutine[Any, Any, None]:
        return self._aleave(current_owner(), exc)

    async def _aleave(self, owner: Owner, exc: BaseException | None) -> None:
        ran_out = self._ran_out(owner)
        try:
            await self._arelease(owner)
        except LockLost as error:
            if not error.unconfirmed:  # a release too few answered: the block itself was safe
                ran_out = error
        if ran_out is not None:
            _report_lost(ran_out, exc)

    # --- helpers ---------------------------------------------------------------------------------

    def _want(self, owner: Owner) -> procedures.Want:
        # The value names the owner's task (``aacquire()`` may run in an inner one: wait_for),
        # and the thread: a thread owner is the current thread itself (``current_owner``).
        if isinstance(owner, asyncio.Task):
            task, thread = owner.get_name(), threading.current_thread().name
        else:
            task, thread = None, owner.name  # type: ignore[attr-defined]  # (a Thread)
        value, parts = new_value(self._options.label, self.ttl, task, thread)
        return procedures.Want(
            self.resource, self.resources, self.keys, self.ttl, self.wait, value, parts
        )

    def _acquiring(self, want: procedures.Want) -> Procedure[procedures.Won]:
        """The acquisition's procedure (a permit's and a reader's are their own)."""
        if want.wait > 0:
            return procedures.acquire(self._redlock, want)
        return procedures.acquire_once(self._redlock, want)

    def _explaining(
        self, want: procedures.Want, error: LockNotAcquired
    ) -> Procedure[LockContended] | None:
        """What says more of a plain lock's refusal (one GET round: a mode's marker may hold its
        key, ``markers.explain``), run after its acquisition gave up; None if nothing can: a lock
        over several resources, a mode's own (``GroupLock``). (Not a generator around every
        acquisition's procedure: that layer cost ~5k CPU instructions a cycle.)"""
        if isinstance(error, LockContended) and not want.several:
            return markers.explain(want.keys[0], error)
        return None

    def _outcome(self, want: procedures.Want) -> procedures.Won:
        began = time.monotonic()
        try:
            return run(self._redlock, self._acquiring(want))
        except LockNotAcquired as error:
            explaining = self._explaining(want, error)
            if explaining is None:
                self._not_acquired(error, began)
                raise
            explained = run(self._redlock, explaining)
        self._not_acquired(explained, began)
        raise explained from None

    async def _aoutcome(self, want: procedures.Want) -> procedures.Won:
        began = time.monotonic()
        try:
            return await arun(self._redlock, self._acquiring(want))
        except LockNotAcquired as error:
            explaining = self._explaining(want, error)
            if explaining is None:
                self._not_acquired(error, began)
                raise
            explained = await arun(self._redlock, explaining)
        self._not_acquired(explained, began)
        raise explained from None

    def _not_acquired(self, error: LockNotAcquired, began: float) -> None:
        waited = time.monotonic() - began
        notify(self._redlock.observer, "not_acquired", self, waited=waited, error=error)

    def _hold(self, owner: Owner, want: procedures.Want, won: procedures.Won) -> Lease:
        redlock = self._redlock
        lease = self._lease(owner, want, won)
        self._callers.add(owner, lease)
        ref = redlock.holders.add(lease)
        if self._options.auto_extend:
            redlock.watchdog.watch(lease)
        elif self._options.on_lost is not None or not isinstance(redlock.observer, NullObserver):
            redlock.watchdog.watch_expiry(lease, ref)  # someone listens: tell when it runs out
        waited = lease.acquired_at - won.began
        notify_acquired(redlock.observer, self, waited, won.attempts)
        lease.note_failures(won.failures, "acquire")
        return lease

    def _lease(self, owner: Owner, want: procedures.Want, won: procedures.Won) -> Lease:
        return granted(self, owner, want.value, won, parts=want.parts)

    def _reenter(self, owner: Owner) -> bool:
        """True if ``owner`` re-entered a lease it holds (see ``reentry``); False if we must
        acquire for real."""
        try:
            lease = reentry.reentered(self, owner, self._callers.get(owner), self._redlock.holders)
        except LockContended as error:
            notify(self._redlock.observer, "not_acquired", self, waited=0.0, error=error)
            raise
        if lease is None:
            return False
        options = self._options
        if options.at_least is not None or options.at_most is not None:
            bounds.enter(self._redlock, lease, options.at_least, options.at_most)
        self._callers.add(owner, lease)
        return True

    def _detach(self, owner: Owner) -> Lease | None:
        """Let go of ``owner``'s lease; return it if it was its last holder (release it on the
        masters), None for an inner re-entrant entry. RuntimeError if ``owner`` does not hold it
        through this handle (or we are a forked child: the parent holds it, not us)."""
        lease = self._callers.detach(owner, "release", self.resource)
        lease.depth -= 1
        if lease.depth > 0:
            self._left_inner(lease)
            return None
        lease.released = True
        self._redlock.holders.remove(lease)
        return lease

    def _left_inner(self, lease: Lease) -> None:
        """An inner re-entrant entry of ``lease`` was let go of (no round): for subclasses."""

    def _released(self, owner: Owner, lease: Lease) -> None:
        self._callers.ended(owner, lease)
        held = time.monotonic() - lease.acquired_at
        notify_released(self._redlock.observer, self, held)

    def _extendable(self, ttl: float | None, owner: Owner) -> tuple[Lease, float | None]:
        lease = self._held_lease("extend", owner)
        if ttl is not None:
            ttl = self._redlock.check_ttl(ttl)  # (within max_ttl, if set)
        # (``max_extensions`` is checked by the extend procedure itself, atomically with the
        # watchdog's renewals: ``Lease.reserve_extension``.)
        return lease, ttl

    def _fenced(self, action: str, owner: Owner) -> tuple[Lease, str]:
        if len(self.resources) > 1:
            raise RuntimeError(
                f"lock {self.resource!r} is over several resources, each with its fencing "
                f"token: use lock.fences (await lock.afences())"
            )
        return self._held_lease(action, owner), self.resources[0]

    def _ran_out(self, owner: Owner) -> LockLost | None:
        """Leaving a block: whether the owner's lease ran out inside it (before the release)."""
        lease = self._callers.get(owner)
        if lease is None or not lease.check_lost():
            return None
        return lease.lost_error()

    def _held_lease(self, action: str, owner: Owner) -> Lease:
        return self._callers.held(owner, action, self.resource)


def _report_lost(error: LockLost, exc: BaseException | None) -> None:
    """Leaving a block whose lease was lost: raise it, once; or, if the block is already raising,
    say it on that error instead of masking it."""
    if exc is not None:
        exc.add_note(str(error))
        return
    raise error
