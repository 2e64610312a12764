"""What one lock's copies on the masters say about it: each master's ``Copy`` (or an
``UnreadableKey`` for what is not a lock value), and the ``HeldLock`` they make together: its
holder (the token found on the most masters), its state (``HELD``, ``UNKNOWN``, ``STALE``), its
validity and stale copies. Pure: no I/O here (``inventory`` reads the masters)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..engine.base import protocol
from ..engine.base.values import Owner

__all__ = ["HELD", "STALE", "UNKNOWN", "Copy", "HeldLock", "Owner", "UnreadableKey", "summarize"]


@dataclass(frozen=True)
class Copy:
    """One master's copy of a lock key."""

    node: str
    fingerprint: str
    ttl: float | None  # seconds left on this master; None: the key has no expiry (not ours)
    owner: Owner


@dataclass(frozen=True)
class UnreadableKey:
    """A key under the lock prefix on one master that is not a lock value we can read."""

    node: str
    resource: str  # the name after the prefix (bytes that are not UTF-8 kept as surrogates)
    kind: str  # its Redis type ("string", "hash"...), or "unknown" when TYPE was refused
    size: int | None  # bytes of a string, elements of another type; None: not known
    reason: str

    @property
    def size_text(self) -> str:
        if self.size is None:
            return "size unknown"
        unit = "byte" if self.kind == "string" else "element"
        return f"{self.size} {unit}{'' if self.size == 1 else 's'}"


#: What a lock's copies say about it. HELD: a quorum of masters has the holder's copy. UNKNOWN:
#: not a quorum among the masters read, but the masters that could not be read could make one;
#: nothing is called stale then. STALE: no quorum even if every unread master had a copy.
HELD, UNKNOWN, STALE = "held", "unknown", "stale"


@dataclass(frozen=True)
class HeldLock:
    """One resource across all masters. The holder is the token found on the most masters; when
    it is HELD, copies with other tokens are stale; when STALE, every copy is."""

    resource: str
    node_count: int
    quorum: int
    fingerprint: str
    owner: Owner
    held_on: int
    unread: int  # masters that could not be read: held_on is a lower bound
    min_ttl: float | None
    max_ttl: float | None
    validity: float  # estimate: seconds until fewer than a quorum of the holder's copies remain
    fence: int | None
    stale: tuple[Copy, ...]
    copies: tuple[Copy, ...]
    #: A lock over several resources: all of them (this one included), one holder. Empty for a
    #: lock over one resource.
    resources: tuple[str, ...] = ()
    #: "permit" (one of a semaphore's), "reader", or "lock"; ``group`` the semaphore's or the
    #: readers/writer lock's name, ``limit`` the semaphore's N (None if its marker is gone),
    #: ``slot`` a permit's slot. A permit's ``resource`` is ``<group>#<slot>``, as it is shown;
    #: a plain lock may have that very name (they are different keys): ``slot`` tells them apart.
    mode: str = "lock"
    group: str = ""
    limit: int | None = None
    slot: int | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return self.resources or (self.resource,)

    @property
    def name(self) -> str:
        """What to show: the resource, or the resources of a lock over several."""
        return " + ".join(self.names)

    @property
    def has_quorum(self) -> bool:
        return self.held_on >= self.quorum

    @property
    def state(self) -> str:
        if self.has_quorum:
            return HELD
        return UNKNOWN if self.held_on + self.unread >= self.quorum else STALE

    @property
    def acquired_at(self) -> float | None:
        return self.owner.since


def summarize(
    resource: str,
    copies: Sequence[Copy],
    *,
    node_count: int,
    unread: int = 0,
    fence: int | None,
    drift_factor: float,
) -> HeldLock:
    """Group one resource's copies by token fingerprint and name the holder."""
    counts = Counter(c.fingerprint for c in copies)

    def weight(fp: str) -> tuple[int, float, str]:  # most copies, then longest TTL, then stable
        return counts[fp], max(_ttl_order(c.ttl) for c in copies if c.fingerprint == fp), fp

    holder = max(counts, key=weight)
    mine = [c for c in copies if c.fingerprint == holder]
    quorum = protocol.quorum(node_count)
    ttls = [c.ttl for c in mine if c.ttl is not None]
    owner = mine[0].owner
    validity = 0.0
    if len(mine) >= quorum:
        # The lease stays exclusive while a quorum of copies lives: until the quorum-th longest
        # TTL runs out, less the holder's own drift allowance.
        kth = sorted((_ttl_order(c.ttl) for c in mine), reverse=True)[quorum - 1]
        lease = owner.ttl if owner.ttl is not None else (max(ttls) if ttls else 0.0)
        validity = max(0.0, kth - protocol.drift(lease, drift_factor))
        if math.isinf(validity):
            validity = 0.0  # keys without expiry are not ours; claim no validity for them
    if len(mine) >= quorum:
        stale = tuple(c for c in copies if c.fingerprint != holder)
    elif len(mine) + unread >= quorum:
        stale = ()  # the unread masters may hold the rest of a live quorum: we cannot tell
    else:
        stale = tuple(copies)
    return HeldLock(
        resource=resource,
        node_count=node_count,
        quorum=quorum,
        fingerprint=holder,
        owner=owner,
        held_on=len(mine),
        unread=unread,
        min_ttl=min(ttls) if ttls else None,
        max_ttl=max(ttls) if ttls else None,
        validity=validity,
        fence=fence,
        stale=stale,
        copies=tuple(copies),
    )


def _ttl_order(ttl: float | None) -> float:
    return math.inf if ttl is None else ttl
