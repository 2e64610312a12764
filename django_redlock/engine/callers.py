"""Who holds what through one ``Lock`` handle (a handle may be shared by threads and tasks, each
with a lease of its own): ``Callers``."""

from __future__ import annotations

import weakref

from . import process
from .leases import Lease, Owner, describe


class Callers:
    """Who holds what through one ``Lock`` handle: each caller's lease, by its owner (the task
    or thread object), how many times more it entered it through this handle (re-entrant), and
    whether each one's last lease was lost (readable after its release; held weakly, so a task
    or thread that ended is forgotten). A lease taken by another process (we are a forked child)
    is nobody's here."""

    __slots__ = ("_ended", "_leases", "_nested", "_one", "resource")

    def __init__(self, resource: str) -> None:
        self.resource = resource
        #: One caller at a time (the usual case) needs no dict, nor a pair: a caller's lease
        #: names its owner (the lease an owner holds here is always its own: ``Lease.owner``).
        self._one: Lease | None = None
        self._leases: dict[Owner, Lease] | None = None
        self._nested: dict[Owner, int] | None = None
        self._ended: weakref.WeakKeyDictionary[Owner, bool] | None = None

    def _lease_of(self, owner: Owner) -> Lease | None:
        one = self._one
        if one is not None and one.owner is owner:
            return one
        return None if self._leases is None else self._leases.get(owner)

    def _forget(self, owner: Owner) -> None:
        if self._one is not None and self._one.owner is owner:
            self._one = None
        elif self._leases is not None:
            self._leases.pop(owner, None)

    def get(self, owner: Owner) -> Lease | None:
        lease = self._lease_of(owner)
        if lease is not None and lease.pid != process.pid():
            return None  # the parent's, copied by fork(): this process holds nothing
        return lease

    def add(self, owner: Owner, lease: Lease) -> None:
        mine = self._lease_of(owner)
        if mine is lease:  # re-entered through this same handle
            if self._nested is None:
                self._nested = {}
            self._nested[owner] = self._nested.get(owner, 0) + 1
            return
        if mine is not None:
            self._forget(owner)
        if self._one is None and lease.owner is owner:  # (always so: ``_one`` relies on it)
            self._one = lease
        else:
            if self._leases is None:
                self._leases = {}
            self._leases[owner] = lease
        if self._nested:
            self._nested.pop(owner, None)

    def detach(self, owner: Owner, action: str) -> Lease:
        """``owner``'s lease, let go of once (its innermost entry through this handle)."""
        lease = self._lease_of(owner)
        if lease is None:
            owners = [*([self._one.owner] if self._one else ()), *(self._leases or ())]
            holders = ", ".join(describe(o) for o in owners) or "nobody"
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it is not acquired by "
                f"{describe(owner)} through this object (held through it by: {holders}); only "
                f"the thread or task that acquired a lock may release it"
            )
        if lease.pid != process.pid():  # the parent's: forget it, every entry of it
            self._forget(owner)
            if self._nested:
                self._nested.pop(owner, None)
            raise self._forked(lease, action)
        if self._nested and owner in self._nested:
            if self._nested[owner] > 1:
                self._nested[owner] -= 1
            else:
                del self._nested[owner]
            return lease
        self._forget(owner)
        return lease

    def held(self, owner: Owner, action: str) -> Lease:
        """``owner``'s lease, or RuntimeError saying why it has none to ``action``."""
        lease = self._lease_of(owner)
        if lease is None:
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it is not acquired by "
                f"{describe(owner)} through this object"
            )
        if lease.pid != process.pid():
            raise self._forked(lease, action)
        return lease

    def _forked(self, lease: Lease, action: str) -> RuntimeError:
        return RuntimeError(
            f"cannot {action} lock {self.resource!r}: it was acquired by process {lease.pid}, "
            f"and a forked child does not hold its parent's locks (it may acquire its own)"
        )

    def ended(self, owner: Owner, lease: Lease) -> None:
        if self._ended is None:
            self._ended = weakref.WeakKeyDictionary()
        self._ended[owner] = lease.lost

    def was_lost(self, owner: Owner) -> bool:
        return bool(self._ended and self._ended.get(owner, False))
