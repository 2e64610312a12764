"""The checkers: pure functions over what the client processes recorded.

Every critical section leaves a ``Section`` record, timed on ``time.monotonic()`` (on Linux,
CLOCK_MONOTONIC is one clock for the whole machine, so records of different processes compare).
The checkers are *sound*: each recorded time errs on the safe side (``acquired`` is read after the
lock was won, ``released`` before it is let go, ``valid_until`` from a validity read after
``acquired``), so a correct lock never trips them; they are not complete (a violation between
the real and the recorded instants goes unseen).

- **lost updates**: the counter written inside the sections (GET, sleep, SET; never INCR, which
  cannot see an overlap) must end equal to the number of sections that wrote it.
- **interval sweep**: no two sections may overlap while both are within validity, i.e. the
  intervals ``[acquired, min(released, valid_until)]`` must be disjoint; and no section may be
  handed a lock whose validity had already run out.
- **fencing**: tokens strictly increase in the order the lock was acquired; the fenced store
  accepted tokens in strictly increasing order; and a write made within validity was never
  rejected (only a newer holder's token could have beaten it). Writes made after validity ran out
  ("stale") are counted, with how many the store rejected.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Section:
    """One critical section as a client process saw it."""

    worker: str  # "process index" or "process index/thread index"
    seq: int  # the worker's section number
    acquired: float  # monotonic time right after the lock was won
    valid_until: float  # acquired + lock.validity read then: end of guaranteed exclusivity
    released: float  # monotonic time right before the lock was let go
    fence: int | None  # the lease's fencing token (None: it could not be issued)
    counted: bool  # wrote the counter (the lock still said it was held)
    fenced: bool | None  # the fenced store accepted (True) / rejected (False) its write
    wrote_at: float | None  # monotonic time of the fenced write
    lost: bool = False  # the lock reported the lease lost (LockLost on leaving the block)
    note: str = ""

    @property
    def end(self) -> float:
        """End of the stretch in which this section was both holding and valid."""
        return min(self.released, self.valid_until)


@dataclass(frozen=True, slots=True)
class Failure:
    """An acquisition that raised (``LockContended``, ``QuorumUnavailable``, ...)."""

    worker: str
    kind: str  # the exception's class name
    started: float  # monotonic
    elapsed: float  # seconds until it raised
    wait: float  # the wait the lock was given
    message: str = ""


@dataclass(frozen=True)
class Verdict:
    """What the checkers found in one run. ``violations`` is their sum: 0 for a correct lock."""

    sections: int  # sections recorded
    counted: int  # sections that wrote the counter
    counter: int  # the counter's final value
    lost_updates: int  # counted - counter (negative: writes nobody recorded)
    overlaps: int  # sections that began inside another's valid, held stretch
    expired_handouts: int  # sections whose validity had run out when they got the lock
    fence_violations: int
    stale_writes: int  # fenced writes made after the writer's validity ran out
    stale_rejected: int  # ... of which the store rejected
    examples: tuple[str, ...] = field(default=())

    @property
    def violations(self) -> int:
        return (
            abs(self.lost_updates) + self.overlaps + self.expired_handouts + self.fence_violations
        )


def lost_updates(sections: Sequence[Section], counter: int) -> int:
    """How many counter writes were lost: sections that wrote it minus its final value."""
    return sum(s.counted for s in sections) - counter


def expired_handouts(sections: Sequence[Section]) -> list[Section]:
    """Sections that were given a lock with no validity left (the engine must refuse those)."""
    return [s for s in sections if s.valid_until <= s.acquired]


def overlaps(sections: Sequence[Section]) -> list[tuple[Section, Section]]:
    """Sweep by start time: each section that began before the end of an earlier one's valid,
    held stretch, paired with that earlier section. Touching (end == start) is not overlapping:
    the next holder can only start after the previous one let go or expired."""
    stretches = sorted(
        (s for s in sections if s.end > s.acquired), key=lambda s: (s.acquired, s.end)
    )
    found: list[tuple[Section, Section]] = []
    latest: Section | None = None  # the section whose stretch ends last so far
    for section in stretches:
        if latest is not None and section.acquired < latest.end:
            found.append((latest, section))
        if latest is None or section.end > latest.end:
            latest = section
    return found


def fence_order_violations(sections: Sequence[Section]) -> list[tuple[Section, Section]]:
    """Consecutive sections (in acquisition order) whose tokens did not strictly increase."""
    fenced = sorted((s for s in sections if s.fence is not None), key=lambda s: s.acquired)
    return [
        (a, b)
        for a, b in zip(fenced, fenced[1:], strict=False)
        if b.fence is not None and a.fence is not None and b.fence <= a.fence
    ]


def accepted_order_violations(accepted: Sequence[int]) -> list[tuple[int, int]]:
    """Pairs of consecutive tokens the fenced store accepted that did not strictly increase."""
    return [(a, b) for a, b in zip(accepted, accepted[1:], strict=False) if b <= a]


def rejected_while_valid(sections: Sequence[Section]) -> list[Section]:
    """Fenced writes rejected although made within the writer's validity: only a token at least
    as high, from another holder, can have beaten them, so two holders overlapped or a token
    repeated."""
    return [
        s
        for s in sections
        if s.fenced is False and s.wrote_at is not None and s.wrote_at < s.valid_until
    ]


def stale_writes(sections: Sequence[Section]) -> list[Section]:
    """Fenced writes made after the writer's validity ran out (a paused holder, a slow one)."""
    return [
        s
        for s in sections
        if s.fenced is not None and s.wrote_at is not None and s.wrote_at >= s.valid_until
    ]


def describe(section: Section) -> str:
    return (
        f"{section.worker}#{section.seq} [{section.acquired:.4f}, {section.end:.4f}] "
        f"fence={section.fence}"
    )


def check(sections: Sequence[Section], counter: int, accepted: Sequence[int]) -> Verdict:
    """Run every checker over one run's records; ``accepted`` is the fenced store's log of the
    tokens it accepted, in the order it accepted them."""
    overlapping = overlaps(sections)
    expired = expired_handouts(sections)
    order = fence_order_violations(sections)
    store = accepted_order_violations(accepted)
    refused = rejected_while_valid(sections)
    stale = stale_writes(sections)
    examples = (
        [f"overlap: {describe(a)} and {describe(b)}" for a, b in overlapping[:3]]
        + [f"expired handout: {describe(s)}" for s in expired[:3]]
        + [f"fence not increasing: {describe(a)} then {describe(b)}" for a, b in order[:3]]
        + [f"store accepted {a} then {b}" for a, b in store[:3]]
        + [f"valid write rejected: {describe(s)}" for s in refused[:3]]
    )
    return Verdict(
        sections=len(sections),
        counted=sum(s.counted for s in sections),
        counter=counter,
        lost_updates=lost_updates(sections, counter),
        overlaps=len(overlapping),
        expired_handouts=len(expired),
        fence_violations=len(order) + len(store) + len(refused),
        stale_writes=len(stale),
        stale_rejected=sum(s.fenced is False for s in stale),
        examples=tuple(examples),
    )
