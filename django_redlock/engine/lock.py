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

import os
import time
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import procedures, protocol
from .drivers import arun, run
from .errors import LockContended, LockLost, LockNotAcquired
from .events import notify
from .leases import Lease, Owner, current_owner, describe
from .values import make_value

if TYPE_CHECKING:
    from .redlock import Redlock


class Lock:
    """A lock on ``resource`` over the masters of a ``Redlock``; make one with
    ``Redlock.lock()`` (or ``django_redlock.redlock()``)."""

    def __init__(
        self,
        redlock: Redlock,
        resource: str,
        *,
        ttl: float,
        wait: float,
        label: str | None = None,
        auto_extend: bool = False,
        max_extensions: int | None = None,
        max_hold: float | None = None,
        reentrant: bool = False,
        on_lost: Callable[[Lock, LockLost], None] | None = None,
    ) -> None:
        self._redlock = redlock
        self.resource = protocol.check_resource(resource)
        self.ttl = protocol.check_ttl(ttl)
        self.wait = protocol.check_seconds("wait", wait, allow_zero=True)
        if label is not None and not isinstance(label, str):
            raise ValueError(f"label must be a str, got {label!r}")
        if max_extensions is not None and (
            isinstance(max_extensions, bool)
            or not isinstance(max_extensions, int)
            or max_extensions < 0
        ):
            raise ValueError(f"max_extensions must be an int >= 0, got {max_extensions!r}")
        if max_hold is not None:
            max_hold = protocol.check_seconds("max_hold", max_hold, allow_zero=False)
        if on_lost is not None and not callable(on_lost):
            raise ValueError(f"on_lost must be callable, got {on_lost!r}")
        self.label = label
        self.auto_extend = bool(auto_extend)
        self.max_extensions = max_extensions
        self.max_hold = max_hold
        self.reentrant = bool(reentrant)
        self.on_lost = on_lost
        self.key = redlock.lock_key(resource)
        #: Each caller's lease, by its owner (task or thread object).
        self._leases: dict[Owner, Lease] = {}

    def __repr__(self) -> str:
        lease = self._leases.get(current_owner())
        state = "unlocked" if lease is None else "lost" if lease.lost else "held"
        return f"<Lock {self.resource!r} {state}>"

    # --- what the holder can ask -----------------------------------------------------------------

    @property
    def held(self) -> bool:
        """Acquired by the calling thread/task, not released, and still within validity."""
        lease = self._leases.get(current_owner())
        return lease is not None and not lease.check_lost()

    @property
    def validity(self) -> float:
        """Seconds of guaranteed exclusivity left (0.0 when not held), on the monotonic clock."""
        lease = self._leases.get(current_owner())
        return 0.0 if lease is None or lease.lost else lease.validity

    @property
    def lost(self) -> bool:
        """True once the lease ran out, or a renewal found our token gone, while we held it."""
        lease = self._leases.get(current_owner())
        return lease is not None and lease.check_lost()

    @property
    def fence(self) -> int:
        """The fencing token of this lease: an int that strictly increases per resource across
        all holders. Issued by a quorum the first time it is read (two rounds), then cached.
        In async code use ``await lock.afence()``."""
        return run(self._redlock, procedures.fence(self._redlock, self._held_lease("fence")))

    async def afence(self) -> int:
        lease = self._held_lease("fence")
        return await arun(self._redlock, procedures.fence(self._redlock, lease))

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
            want = self._want()
            self._hold(owner, want, self._outcome(run, want))
        return self

    def extend(self) -> float:
        """Renew the lease to the full TTL on a quorum; returns the new validity in seconds.
        Retries until renewed or the lease runs out, then raises ``LockLost``."""
        lease = self._held_lease("extend")
        return run(self._redlock, procedures.extend(self._redlock, lease, once=False))

    def release(self) -> None:
        """Delete our key on every master (compare-and-delete: never another owner's)."""
        lease = self._detach(current_owner())
        if lease is not None:
            run(self._redlock, procedures.release(self._redlock, lease))
            self._released(lease)

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._leases.get(current_owner())
        lost = lease is not None and lease.check_lost()
        self.release()
        if lease is not None and lost:
            _report_lost(lease, exc)

    # --- async API -------------------------------------------------------------------------------
    # The owner is the task that *calls* aacquire()/arelease(), bound before the coroutine runs:
    # ``await asyncio.wait_for(lock.aacquire(), 5)`` runs it in an inner task on Python 3.11,
    # and the lease must still be the caller's.

    def aacquire(self) -> Coroutine[Any, Any, Lock]:
        return self._aacquire(current_owner())

    async def _aacquire(self, owner: Owner) -> Lock:
        if not self._reenter(owner):
            want = self._want()
            self._hold(owner, want, await self._aoutcome(want))
        return self

    async def aextend(self) -> float:
        lease = self._held_lease("extend")
        return await arun(self._redlock, procedures.extend(self._redlock, lease, once=False))

    def arelease(self) -> Coroutine[Any, Any, None]:
        return self._arelease(current_owner())

    async def _arelease(self, owner: Owner) -> None:
        lease = self._detach(owner)
        if lease is not None:
            await arun(self._redlock, procedures.release(self._redlock, lease))
            self._released(lease)

    async def __aenter__(self) -> Lock:
        return await self.aacquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._leases.get(current_owner())
        lost = lease is not None and lease.check_lost()
        await self.arelease()
        if lease is not None and lost:
            _report_lost(lease, exc)

    # --- helpers ---------------------------------------------------------------------------------

    def _want(self) -> procedures.Want:
        return procedures.Want(
            self.resource, self.key, self.ttl, self.wait, make_value(self.label, self.ttl)
        )

    def _outcome(self, runner: Any, want: procedures.Want) -> procedures.Won:
        began = time.monotonic()
        try:
            won: procedures.Won = runner(self._redlock, procedures.acquire(self._redlock, want))
        except LockNotAcquired as error:
            self._not_acquired(error, began)
            raise
        return won

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
            key=self.key,
            ttl=self.ttl,
            value=want.value,
            valid_until=won.valid_until,
            owner=owner,
            pid=os.getpid(),
            handle=self,
            observer=redlock.observer,
            on_lost=self.on_lost,
            queued_as=won.queued_as,
        )
        self._leases[owner] = lease
        redlock.holders[self.key] = lease
        if self.auto_extend:
            redlock.watchdog.watch(lease, self.max_extensions, self.max_hold)
        waited = lease.acquired_at - won.began
        notify(redlock.observer, "acquired", self, waited=waited, attempts=won.attempts)

    def _reenter(self, owner: Owner) -> bool:
        """True if ``owner`` already holds the resource and re-entered it (``reentrant=True``);
        ``LockContended`` at once if it holds it and may not re-enter (waiting would be waiting
        for ourselves); False if we must acquire for real."""
        if owner in self._leases:
            raise RuntimeError(
                f"lock {self.resource!r} is already acquired through this object by "
                f"{describe(owner)}; use one Lock object per acquisition, or reentrant=True"
            )
        outer = self._redlock.holders.get(self.key)
        if outer is None or outer.released or outer.owner is not owner or outer.pid != os.getpid():
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
        self._leases[owner] = outer
        return True

    def _detach(self, owner: Owner) -> Lease | None:
        """Let go of ``owner``'s lease; return it if it was its last holder (release it on the
        masters), None for an inner re-entrant handle."""
        lease = self._leases.pop(owner, None)
        if lease is None:
            holders = ", ".join(describe(o) for o in list(self._leases)) or "nobody"
            raise RuntimeError(
                f"cannot release lock {self.resource!r}: it is not acquired by {describe(owner)} "
                f"through this object (held through it by: {holders}); only the thread or task "
                f"that acquired a lock may release it"
            )
        lease.depth -= 1
        if lease.depth > 0:
            return None
        lease.released = True
        if self._redlock.holders.get(self.key) is lease:
            del self._redlock.holders[self.key]
        if lease.pid != os.getpid():
            return None  # a forked child never releases its parent's lock
        return lease

    def _released(self, lease: Lease) -> None:
        notify(self._redlock.observer, "released", self, held=time.monotonic() - lease.acquired_at)

    def _held_lease(self, action: str) -> Lease:
        owner = current_owner()
        lease = self._leases.get(owner)
        if lease is None:
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it is not acquired by {describe(owner)} "
                f"through this object"
            )
        if lease.pid != os.getpid():
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it was acquired by process "
                f"{lease.pid}, and a forked child does not hold its parent's locks"
            )
        return lease


def _report_lost(lease: Lease, exc: BaseException | None) -> None:
    message = lease.lost_message()
    if exc is not None:
        # Do not mask the block's own error; say on it that exclusivity was also lost.
        exc.add_note(message)
        return
    raise LockLost(lease.resource, message)
