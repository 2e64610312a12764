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
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import holding, procedures, process, protocol
from .drivers import arun, run
from .errors import ExtensionLimit, LockContended, LockLost, LockNotAcquired
from .events import NullObserver, notify
from .leases import Callers, Lease, Owner, current_owner, describe
from .values import make_value

if TYPE_CHECKING:
    from .redlock import Redlock


class Lock:
    """A lock over the masters of a ``Redlock``: ``Redlock.lock()``, ``redlock()``."""

    def __init__(
        self,
        redlock: Redlock,
        *resources: str,
        ttl: float,
        wait: float,
        label: str | None = None,
        auto_extend: bool = False,
        max_extensions: int | None = None,
        max_hold: float | None = None,
        reentrant: bool = False,
        on_lost: Callable[[Lock, LockLost], None] | None = None,
        at_least: float | None = None,
        at_most: float | None = None,
    ) -> None:
        self._redlock = redlock
        self.resources = protocol.check_resources(resources)
        # ``resource``: the name (several: joined with " + "), for messages, events and metrics;
        # ``keys``: the keys on the masters; ``key`` names them as one, for re-entry.
        if len(self.resources) == 1:  # the usual case, built on every ``with redlock(r):``
            self.resource = self.resources[0]
            self.key = redlock.lock_key(self.resource)
            self.keys: tuple[str, ...] = (self.key,)
        else:
            self.resource = " + ".join(self.resources)
            self.keys = tuple(map(redlock.lock_key, self.resources))
            self.key = " + ".join(self.keys)
        self.ttl = protocol.check_ttl(ttl)
        self.at_least, self.at_most = protocol.check_hold_bounds(at_least, at_most)
        self.wait = protocol.check_seconds("wait", wait, allow_zero=True)
        self.label = protocol.check_label(label)
        self.auto_extend = bool(auto_extend)
        self.max_extensions = protocol.check_count("max_extensions", max_extensions)
        if max_hold is not None:
            max_hold = protocol.check_seconds("max_hold", max_hold, allow_zero=False)
        if self.at_most is not None:  # the lease never reaches past it: cut, then not renewed
            self.ttl = min(self.ttl, protocol.check_ttl(self.at_most))
            max_hold = min(max_hold or self.at_most, self.at_most)
        self.max_hold = max_hold
        if on_lost is not None and not callable(on_lost):
            raise ValueError(f"on_lost must be callable, got {on_lost!r}")
        self.reentrant = bool(reentrant)
        self.on_lost = on_lost
        self._callers = Callers(self.resource)

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
        return run(self._redlock, holding.fence(self._redlock, *self._fenced("fence")))

    async def afence(self) -> int:
        return await arun(self._redlock, holding.fence(self._redlock, *self._fenced("fence")))

    @property
    def fences(self) -> dict[str, int]:
        """The fencing token of each resource (see ``fence``). Async: ``await lock.afences()``."""
        lease = self._held_lease("fence")
        return {
            r: run(self._redlock, holding.fence(self._redlock, lease, r)) for r in self.resources
        }

    async def afences(self) -> dict[str, int]:
        lease, redlock = self._held_lease("fence"), self._redlock
        return {r: await arun(redlock, holding.fence(redlock, lease, r)) for r in self.resources}

    def locked(self) -> bool:
        """Ask the masters (one round): True only if a quorum still holds our lease and its
        validity is not over. Finding it gone marks it lost (``lost``, ``on_lost``)."""
        lease = self._callers.get(current_owner())
        if lease is None:
            return False
        return run(self._redlock, holding.holds(self._redlock, lease))

    async def alocked(self) -> bool:
        lease = self._callers.get(current_owner())
        if lease is None:
            return False
        return await arun(self._redlock, holding.holds(self._redlock, lease))

    def check(self) -> None:
        """Raise ``LockLost`` unless the lock is still held within its validity."""
        lease = self._held_lease("check")
        if lease.check_lost():
            raise LockLost(self.resource, lease.lost_message())

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
        (manual and automatic extensions count alike)."""
        lease, ttl = self._extendable(ttl)
        return run(self._redlock, holding.extend(self._redlock, lease, once=False, ttl=ttl))

    def release(self) -> None:
        """Delete our key on every master (compare-and-delete: never another owner's). Raises
        ``LockLost``, after removing our lease wherever it still was, unless a quorum confirmed
        that it removed it: it had run out, or been released by force (exclusivity may have
        been broken: ``lost`` is true), or too few masters answered (``error.unconfirmed``: the
        lease was valid until now, and where it remains it expires within its TTL). A ``with``
        block raises only for the first two: its section was safe in the third."""
        owner = current_owner()
        lease = self._detach(owner)
        if lease is not None:
            try:
                run(self._redlock, holding.let_go(self._redlock, lease, self.at_least))
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
        ran_out = self._ran_out()
        try:
            self.release()
        except LockLost as error:
            if not error.unconfirmed:  # a release too few answered: the block itself was safe
                ran_out = error
        if ran_out is not None:
            _report_lost(ran_out, exc)

    # --- async API -------------------------------------------------------------------------------
    # The owner is the task that *calls* aacquire()/arelease(), bound before the coroutine runs:
    # ``await asyncio.wait_for(lock.aacquire(), 5)`` runs it in an inner task on Python 3.11,
    # and the lease must still be the caller's.

    def aacquire(self) -> Coroutine[Any, Any, Lock]:
        return self._aacquire(current_owner())

    async def _aacquire(self, owner: Owner) -> Lock:
        if not self._reenter(owner):
            want = self._want(owner)
            self._hold(owner, want, await self._aoutcome(want))
        return self

    async def aextend(self, ttl: float | None = None) -> float:
        lease, ttl = self._extendable(ttl)
        extending = holding.extend(self._redlock, lease, once=False, ttl=ttl)
        return await arun(self._redlock, extending)

    def arelease(self) -> Coroutine[Any, Any, None]:
        return self._arelease(current_owner())

    async def _arelease(self, owner: Owner) -> None:
        lease = self._detach(owner)
        if lease is not None:
            try:
                await arun(self._redlock, holding.let_go(self._redlock, lease, self.at_least))
            finally:
                self._released(owner, lease)

    async def __aenter__(self) -> Lock:
        return await self.aacquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        ran_out = self._ran_out()
        try:
            await self.arelease()
        except LockLost as error:
            if not error.unconfirmed:  # a release too few answered: the block itself was safe
                ran_out = error
        if ran_out is not None:
            _report_lost(ran_out, exc)

    # --- helpers ---------------------------------------------------------------------------------

    def _want(self, owner: Owner) -> procedures.Want:
        # The value names the owner's task (``aacquire()`` may run in an inner one: wait_for).
        task = owner.get_name() if isinstance(owner, asyncio.Task) else None
        value = make_value(self.label, self.ttl, task)
        return procedures.Want(self.resource, self.resources, self.keys, self.ttl, self.wait, value)

    def _outcome(self, want: procedures.Want) -> procedures.Won:
        began = time.monotonic()
        try:
            return run(self._redlock, procedures.acquire(self._redlock, want))
        except LockNotAcquired as error:
            self._not_acquired(error, began)
            raise

    async def _aoutcome(self, want: procedures.Want) -> procedures.Won:
        began = time.monotonic()
        try:
            return await arun(self._redlock, procedures.acquire(self._redlock, want))
        except LockNotAcquired as error:
            self._not_acquired(error, began)
            raise

    def _not_acquired(self, error: LockNotAcquired, began: float) -> None:
        waited = time.monotonic() - began
        notify(self._redlock.observer, "not_acquired", self, waited=waited, error=error)

    def _hold(self, owner: Owner, want: procedures.Want, won: procedures.Won) -> None:
        redlock = self._redlock
        lease = Lease(
            resource=self.resource,
            resources=self.resources,
            key=self.key,
            keys=self.keys,
            ttl=self.ttl,
            value=want.value,
            valid_until=won.valid_until,
            owner=owner,
            pid=process.pid(),
            handle=self,
            observer=redlock.observer,
            on_lost=self.on_lost,
            queued_as=won.queued_as,
        )
        self._callers.add(owner, lease)
        redlock.holders[self.key] = lease
        if self.auto_extend:
            redlock.watchdog.watch(lease, self.max_extensions, self.max_hold)
        elif self.on_lost is not None or not isinstance(redlock.observer, NullObserver):
            redlock.watchdog.watch_expiry(lease)  # someone listens: tell when it runs out
        waited = lease.acquired_at - won.began
        notify(redlock.observer, "acquired", self, waited=waited, attempts=won.attempts)
        lease.note_failures(won.failures, "acquire")

    def _reenter(self, owner: Owner) -> bool:
        """True if ``owner`` already holds the resource and re-entered it (``reentrant=True``);
        ``LockContended`` at once if it holds it and may not re-enter (waiting would be waiting
        for ourselves); False if we must acquire for real."""
        if self._callers.get(owner) is not None:
            raise RuntimeError(
                f"lock {self.resource!r} is already acquired through this object by "
                f"{describe(owner)}; use one Lock object per acquisition, or reentrant=True"
            )
        outer = self._redlock.holders.get(self.key)
        if (
            outer is None
            or outer.released
            or outer.owner is not owner
            or outer.pid != process.pid()
        ):
            return False
        if outer.check_lost() and not self.reentrant:
            return False  # its lease ran out: we do not hold it any more, so acquire for real
        if not self.reentrant:
            error = LockContended(
                self.resource,
                f"lock {self.resource!r} is already held by this same thread/task: acquiring it "
                f"again would wait for ourselves; pass reentrant=True to re-enter it",
            )
            notify(self._redlock.observer, "not_acquired", self, waited=0.0, error=error)
            raise error
        if outer.check_lost():
            raise LockLost(self.resource, outer.lost_message())
        outer.depth += 1
        self._callers.add(owner, outer)
        return True

    def _detach(self, owner: Owner) -> Lease | None:
        """Let go of ``owner``'s lease; return it if it was its last holder (release it on the
        masters), None for an inner re-entrant handle."""
        lease = self._callers.detach(owner, "release")
        lease.depth -= 1
        if lease.depth > 0:
            return None
        lease.released = True
        if self._redlock.holders.get(self.key) is lease:
            del self._redlock.holders[self.key]
        if lease.pid != process.pid():
            return None  # a forked child never releases its parent's lock
        return lease

    def _released(self, owner: Owner, lease: Lease) -> None:
        self._callers.ended(owner, lease)
        held = time.monotonic() - lease.acquired_at
        notify(self._redlock.observer, "released", self, held=held)

    def _extendable(self, ttl: float | None) -> tuple[Lease, float | None]:
        lease = self._held_lease("extend")
        if ttl is not None:
            ttl = protocol.check_ttl(ttl)
        if self.max_extensions is not None and lease.extensions >= self.max_extensions:
            raise ExtensionLimit(
                self.resource,
                f"lock {self.resource!r} was extended {lease.extensions} times already: "
                f"max_extensions={self.max_extensions}",
            )
        return lease, ttl

    def _fenced(self, action: str) -> tuple[Lease, str]:
        if len(self.resources) > 1:
            raise RuntimeError(
                f"lock {self.resource!r} is over several resources, each with its fencing "
                f"token: use lock.fences (await lock.afences())"
            )
        return self._held_lease(action), self.resources[0]

    def _ran_out(self) -> LockLost | None:
        """Leaving a block: whether the caller's lease ran out inside it (before the release)."""
        lease = self._callers.get(current_owner())
        if lease is None or not lease.check_lost():
            return None
        return LockLost(lease.resource, lease.lost_message())

    def _held_lease(self, action: str) -> Lease:
        return self._callers.held(current_owner(), action)


def _report_lost(error: LockLost, exc: BaseException | None) -> None:
    """Leaving a block whose lease was lost: raise it, once; or, if the block is already raising,
    say it on that error instead of masking it."""
    if exc is not None:
        exc.add_note(str(error))
        return
    raise error
