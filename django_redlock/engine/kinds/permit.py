"""The handle of a semaphore's permit: a ``Lock`` whose lease is the mutex of the slot it won
(see ``permits``), made by ``Redlock.lock(resource, limit=N)``."""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..algorithm.markers import permits as marker
from ..algorithm.permits import PermitCommands, PermitWant, PermitWon, acquire, remember_free
from ..algorithm.procedures import Want, Won
from ..algorithm.steps import Procedure
from ..handles.granting import granted
from ..leases.leases import Lease, Owner, current_owner
from ..scripts.permits import check_limit, slot_of, slot_prefix
from .group import GroupLock

if TYPE_CHECKING:
    from ..handles.fields import Engine


class Usage:
    """This process's permits in use and waiters for one, per semaphore name (read by the
    metrics at scrape time; names drop out at zero, so the set stays as small as what is live)."""

    def __init__(self) -> None:
        self._new_process()
        os.register_at_fork(after_in_child=self._new_process)  # the parent's are not ours

    def _new_process(self) -> None:
        self._guard = threading.Lock()
        self.in_use: Counter[str] = Counter()
        self.waiting: Counter[str] = Counter()

    def add(self, counter: Counter[str], name: str, change: int) -> None:
        with self._guard:
            counter[name] += change
            if counter[name] <= 0:
                del counter[name]

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """{name: (permits in use, waiters)}."""
        with self._guard:
            names = set(self.in_use) | set(self.waiting)
            return {n: (self.in_use[n], self.waiting[n]) for n in sorted(names)}


USAGE = Usage()


class PermitLock(GroupLock):
    """One permit of the semaphore ``resource`` with ``limit`` permits: a ``Lock`` whose lease is
    the mutex of whichever slot it won. Make one with ``Redlock.lock(resource, limit=N)``."""

    holder = "permit"
    second = "takes a second permit"
    group = "a semaphore"
    key_suffix = "#permits"

    def __init__(self, redlock: Engine, *resources: str, limit: int, **options: Any) -> None:
        limit = check_limit(limit)
        super().__init__(redlock, *resources, option=f"limit={limit}", **options)
        self.limit = limit
        self._marker = marker(limit)
        self._commands = PermitCommands(
            redlock.inbox_prefix,
            redlock.lock_key(self.resource),
            redlock.queue_key(self.resource),
            self._marker,
            slot_prefix(redlock.key_prefix, redlock.spelled(self.resource)),
            limit,
        )

    def __repr__(self) -> str:
        return super().__repr__().replace("<Lock", f"<Permit of {self.limit}", 1)

    @property
    def slot(self) -> int | None:
        """The slot (0 to limit-1) of the calling thread's or task's permit, None if none."""
        lease = self._callers.get(current_owner())
        return None if lease is None else slot_of(lease.keys[0])

    def _want(self, owner: Owner) -> PermitWant:
        redlock = self._redlock
        return self._want_of(
            owner,
            PermitWant,
            limit=self.limit,
            marker_key=redlock.lock_key(self.resource),
            slot_prefix=slot_prefix(redlock.key_prefix, redlock.spelled(self.resource)),
            queue_key=redlock.queue_key(self.resource),
            marker=self._marker,
        )

    def _acquiring(self, want: Want) -> Procedure[Won]:
        """The slots' acquisition, counted as a wait for a permit meanwhile (the metrics)."""
        assert isinstance(want, PermitWant)  # noqa: S101 (our own _want made it)
        USAGE.add(USAGE.waiting, self.resource, 1)
        try:
            won = yield from acquire(self._redlock, want)
        finally:
            USAGE.add(USAGE.waiting, self.resource, -1)
        USAGE.add(USAGE.in_use, self.resource, 1)
        return won

    def _lease(self, owner: Owner, want: Want, won: Won) -> Lease:
        assert isinstance(want, PermitWant)  # noqa: S101
        assert isinstance(won, PermitWon)  # noqa: S101
        keys = (want.slot_key(won.slot),)
        return granted(self, owner, want.value, won, keys, self._commands, parts=want.parts)

    def _released(self, owner: Owner, lease: Lease) -> None:
        prefix, _, slot = lease.keys[0].rpartition("#")
        remember_free(f"{prefix}#", int(slot))
        USAGE.add(USAGE.in_use, self.resource, -1)
        super()._released(owner, lease)
