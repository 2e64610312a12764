"""Who holds what through one ``Lock`` handle (a handle may be shared by threads and tasks, each
with a lease of its own): ``Callers``."""

from __future__ import annotations

import weakref

from ..base import process
from .leases import Lease, Owner, describe


class _Many:
    """What only a handle shared by callers at once, re-entered through, or whose callers lost a
    lease needs: made by the first of them."""

    __slots__ = ("ended", "leases", "nested")

    def __init__(self) -> None:
        self.leases: dict[Owner, Lease] = {}
        self.nested: dict[Owner, int] = {}
        self.ended: weakref.WeakKeyDictionary[Owner, bool] = weakref.WeakKeyDictionary()


class Callers:
    """Who holds what through one ``Lock`` handle: each caller's lease, by its owner (the task
    or thread object), how many times more it entered it through this handle (re-entrant), and
    whether each one's last lease was lost (readable after its release; held weakly, so a task
    or thread that ended is forgotten). A lease taken by another process (we are a forked child)
    is nobody's here.

    One caller at a time, entering once, and never losing its lease (the usual case) needs no
    more than its lease (which names its owner: the lease an owner holds here is always its own);
    the tables of the rest are made by the first caller that needs them (``_Many``). A held lock
    keeps 48 bytes of this, where a pair and three table slots cost it 128."""

    __slots__ = ("_many", "_one")

    def __init__(self) -> None:
        self._one: Lease | None = None
        self._many: _Many | None = None

    def _more(self) -> _Many:
        if self._many is None:
            self._many = _Many()
        return self._many

    def _lease_of(self, owner: Owner) -> Lease | None:
        one = self._one
        if one is not None and one.owner is owner:
            return one
        return None if self._many is None else self._many.leases.get(owner)

    def _forget(self, owner: Owner) -> None:
        if self._one is not None and self._one.owner is owner:
            self._one = None
        elif self._many is not None:
            self._many.leases.pop(owner, None)

    def _unnest(self, owner: Owner) -> bool:
        """One nested entry of ``owner`` let go of; False if it had none (its outermost)."""
        nested = None if self._many is None else self._many.nested
        if not nested or owner not in nested:
            return False
        if nested[owner] > 1:
            nested[owner] -= 1
        else:
            del nested[owner]
        return True

    # (``get``, ``add`` and ``detach`` take the usual case, one caller holding through the
    # handle at a time, without a call to ``_lease_of``: saves 2.5k instructions an engine cycle,
    # 5.8k through ``redlock()``, 1.4%; kept for issue 37's budget.)

    def get(self, owner: Owner) -> Lease | None:
        lease = self._one
        if lease is None or lease.owner is not owner:
            if self._many is None:
                return None
            lease = self._many.leases.get(owner)
        if lease is not None and lease.pid != process.pid:
            return None  # the parent's, copied by fork(): this process holds nothing
        return lease

    def add(self, owner: Owner, lease: Lease) -> None:
        if self._one is None and self._many is None and lease.owner is owner:
            self._one = lease  # the first caller, entering once
            return
        mine = self._lease_of(owner)
        if mine is lease:  # re-entered through this same handle
            nested = self._more().nested
            nested[owner] = nested.get(owner, 0) + 1
            return
        if mine is not None:
            self._forget(owner)
        if self._one is None and lease.owner is owner:  # (always so: ``_one`` relies on it)
            self._one = lease
        else:
            self._more().leases[owner] = lease
        if self._many is not None:
            self._many.nested.pop(owner, None)

    def detach(self, owner: Owner, action: str, resource: str) -> Lease:
        """``owner``'s lease, let go of once (its innermost entry through this handle);
        ``resource``: the handle's, for errors."""
        one = self._one
        if one is not None and one.owner is owner and self._many is None and one.pid == process.pid:
            self._one = None  # its only caller, which entered once
            return one
        lease = self._lease_of(owner)
        if lease is None:
            owners = [
                *([self._one.owner] if self._one else ()),
                *(self._many.leases if self._many else ()),
            ]
            holders = ", ".join(describe(o) for o in owners) or "nobody"
            raise RuntimeError(
                f"cannot {action} lock {resource!r}: it is not acquired by "
                f"{describe(owner)} through this object (held through it by: {holders}); only "
                f"the thread or task that acquired a lock may release it"
            )
        if lease.pid != process.pid:  # the parent's: forget it, every entry of it
            self._forget(owner)
            if self._many is not None:
                self._many.nested.pop(owner, None)
            raise _forked(lease, action, resource)
        if self._unnest(owner):
            return lease
        self._forget(owner)
        return lease

    def held(self, owner: Owner, action: str, resource: str) -> Lease:
        """``owner``'s lease, or RuntimeError saying why it has none to ``action``."""
        lease = self._lease_of(owner)
        if lease is None:
            raise RuntimeError(
                f"cannot {action} lock {resource!r}: it is not acquired by "
                f"{describe(owner)} through this object"
            )
        if lease.pid != process.pid:
            raise _forked(lease, action, resource)
        return lease

    def ended(self, owner: Owner, lease: Lease) -> None:
        if lease.lost or self._many is not None:  # (a release that lost nothing, to nobody who
            self._more().ended[owner] = lease.lost  # had lost one, needs no record)

    def was_lost(self, owner: Owner) -> bool:
        return self._many is not None and self._many.ended.get(owner, False)


def _forked(lease: Lease, action: str, resource: str) -> RuntimeError:
    return RuntimeError(
        f"cannot {action} lock {resource!r}: it was acquired by process {lease.pid}, "
        f"and a forked child does not hold its parent's locks (it may acquire its own)"
    )
