"""A semaphore: ``limit=N`` permits of one name, each an ordinary Redlock mutex on one of N slots.

Why slots, and not a counter on each master. A counter that each master caps at N, with a permit
valid once a majority admitted it, is not safe: N+1 permits need (N+1) * q admissions, and M
masters hold M * N, so with q = M // 2 + 1 the N+1st permit fits as soon as (N+1) * q <= M * N
(N=2 on 5 masters: 3 permits, each admitted by a different 3 of the 5). Safe counters need
q > M*N/(N+1), a quorum that tolerates fewer failed masters the larger N is. Slots keep the lock's
majority and every failure budget of it: permit ``i`` is a mutex of its own (``slot:<name>#i``,
a key no lock name reaches: ``permit_scripts.slot_prefix``), so two permits valid at once are on
two different slots, and there are only N.

Every permit is then an ordinary lease (its own token, TTL, extend, auto-extend, lost notice,
fence, validity), held by the same procedures as a lock (``holding``). What is new is choosing a
slot: each master takes the first free slot from a start the acquirer names (the slot this
process released last, else a random one), so masters that agree on what is free take the same
slot in one round; the acquirer counts the votes per slot, and wins iff a quorum took one slot
(slots taken by a minority are undone; when masters disagree, it tries again from another start).
Waiters queue FIFO, by when they asked, on the semaphore's one waiter queue (not one per slot),
and each master admits in that order: a caller takes a free slot only if fewer live waiters are
ahead of it than slots are free (``permit_scripts``). A release wakes as many waiters as slots
are free.

While any permit is held on a master, the name's plain lock key there holds a marker,
``semaphore:<N>``, that outlives every permit on that master (renewals push it). A plain lock on the
same name cannot be taken over it (its SET NX finds the key), and a semaphore with another limit,
or one that finds a plain lock there, refuses with ``LockContended`` naming the mismatch: never a
silent overlap.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..base import protocol
from ..base.errors import LockContended
from ..leases.leases import Lease
from ..members.interface import Reply
from ..scripts.permits import PERMIT_ACQUIRE, PERMIT_EXTEND, PERMIT_RELEASE, PERMIT_UNDO
from ..waiting.local_queues import Turn
from ..waiting.waiter import Waiter
from .markers import described
from .procedures import (
    EXPIRY_MARGIN,
    JITTER,
    Granted,
    Lost,
    Want,
    Won,
    tally,
    wait_turn,
)
from .refusals import not_acquired
from .steps import AwaitTurn, Listen, Masters, Pause, Procedure, Round, failures, free_in

#: Tries at once on a slot the masters said is free, before pausing (two acquirers that picked
#: the same one split its votes; a pause with jitter lets them drift apart).
SWITCHES = 3


@dataclass(slots=True)  # (as Want: not frozen)
class PermitWant(Want):
    """One permit's request: the semaphore's name (``resource``), its limit, and its keys."""

    limit: int = 1
    marker_key: str = ""
    slot_prefix: str = ""  # slot i's key is this + str(i) (``permit_scripts.slot_prefix``)
    queue_key: str = ""
    marker: str = field(default="", repr=False)

    def slot_key(self, slot: int) -> str:
        return f"{self.slot_prefix}{slot}"


@dataclass(slots=True)
class PermitWon(Won):
    """A won permit: which slot it holds."""

    slot: int = 0


@dataclass(frozen=True, slots=True)
class PermitCommands:
    """How a permit is renewed (slot and marker) and released (the slot, waking the
    semaphore's next waiter); see ``leases.LeaseCommands``."""

    inbox_prefix: str
    marker_key: str
    queue_key: str
    marker: str
    slot_prefix: str = ""
    limit: int = 0

    def extend(self, lease: Lease, ttl_ms: int) -> Round:
        keys = (lease.keys[0], self.marker_key)
        command = PERMIT_EXTEND.evalsha(keys, (lease.value, ttl_ms, self.marker))
        return Round(command, PERMIT_EXTEND)

    def release(self, lease: Lease, *, cleanup: bool = False) -> Round:
        return release_slot(
            self.inbox_prefix,
            lease.keys[0],
            self.queue_key,
            lease.value,
            queued_as=lease.queued_as,
            cleanup=cleanup,
            slot_prefix=self.slot_prefix,
            limit=self.limit,
        )


def release_slot(
    inbox_prefix: str,
    slot_key: str,
    queue_key: str,
    value: str,
    *,
    notify: bool = True,
    queued_as: str = "",
    cleanup: bool = False,
    requeue: tuple[str, int] | None = None,
    slot_prefix: str = "",
    limit: int = 0,
) -> Round:
    """Compare-and-delete one slot, then wake as many of the semaphore's waiters, first first,
    as slots are free (all ``limit`` slots under ``slot_prefix`` are counted; with ``limit=0``,
    the first waiter only). Woken waiters keep their place in the queue until they have a permit
    (``permit_scripts``). ``requeue``: (waiter entry, score) of an attempt undoing a slot it did
    not win, put back in the queue where it was. The marker is left to expire (it outlives the
    permits; deleting it would need every slot read)."""
    entry, score = requeue if requeue is not None else ("", 0)
    args = (
        value,
        "1" if notify else "",
        protocol.notice_digest(value) if notify else "",
        inbox_prefix,
        queued_as,
        entry,
        score,
        now_ms(),
        slot_prefix,
        limit,
    )
    return Round(PERMIT_RELEASE.evalsha((slot_key, queue_key), args), PERMIT_RELEASE, cleanup)


def now_ms() -> int:
    """The client's wall clock in ms: the semaphore queue's scores are in it, so that every
    master orders the waiters alike (see ``permit_scripts``)."""
    return int(time.time() * 1000)


# --- acquire ------------------------------------------------------------------------------------

#: Per semaphore, the slot this process last released (likely free): the first slot tried, so
#: that an uncontended acquisition is one round like a lock's. Bounded.
_HINTS: dict[str, int] = {}


def first_slot(want: PermitWant) -> int:
    hint = _HINTS.get(want.slot_prefix)
    return JITTER.randrange(want.limit) if hint is None or hint >= want.limit else hint


def remember_free(slot_prefix: str, slot: int) -> None:
    if len(_HINTS) > 10_000:
        _HINTS.clear()
    _HINTS[slot_prefix] = slot


@dataclass(slots=True)
class PermitGranted(Granted):
    slot: int = 0


def queue_entry(waiter: Waiter, deadline_ms: int) -> str:
    """How a waiter stands in a semaphore's queue on the masters: its id (what a release names)
    and when it stops waiting (client ms), after which they drop it (``permit_scripts``)."""
    return f"{waiter.id} {deadline_ms}"


def attempt(
    masters: Masters, want: PermitWant, start_slot: int, entry: str, score: int
) -> Procedure[PermitGranted | Lost]:
    """The lock's five steps (``procedures.attempt``) for a permit: every master takes a free
    slot from ``start_slot`` on, if fewer waiters are queued ahead of it than slots are free
    (``permit_scripts``); won iff a quorum took the same slot, within validity. The slots taken
    elsewhere (a minority, when masters disagree on which are free) are undone, and a waiter
    keeps its place in the queue there. ``entry``: the waiter's ``queue_entry`` ('' if it does
    not wait); ``score``: its place in the queue, when it asked (client ms)."""
    start = time.monotonic()
    now = now_ms()
    command = PERMIT_ACQUIRE.evalsha(
        (want.marker_key, want.queue_key),
        (
            want.value,
            int(want.ttl * 1000),
            want.marker,
            entry,
            score,
            want.slot_prefix,
            want.limit,
            start_slot,
            now,
            protocol.notice_digest(f"{want.value}@{now}@{start}"),
            masters.inbox_prefix,
        ),
    )
    try:
        replies: list[Reply] = yield Round(command, PERMIT_ACQUIRE)
    except BaseException:
        # (The marker key: unused by the script, it routes it to the name's shard on a Cluster.)
        undo = PERMIT_UNDO.evalsha((want.marker_key,), (want.value, want.slot_prefix, want.limit))
        yield Round(undo, PERMIT_UNDO, cleanup=True)
        raise
    taken = Counter(r - 1 for r in replies if isinstance(r, int) and r >= 1)
    slot, votes = taken.most_common(1)[0] if taken else (-1, 0)
    # One slot's votes are the grants; another slot's are refusals of this one.
    as_votes: list[Reply] = [
        r if not isinstance(r, int) or r < 1 else (1 if r - 1 == slot else 0) for r in replies
    ]
    result = tally(masters, as_votes, want.ttl, start)
    won = result.won and votes >= masters.quorum
    for other in taken:
        if other != slot or not won:
            key = want.slot_key(other)
            requeue = (entry, score) if entry else None
            yield release_slot(
                masters.inbox_prefix,
                key,
                want.queue_key,
                want.value,
                requeue=requeue,
                slot_prefix=want.slot_prefix,
                limit=want.limit,
            )
    if won and entry and any(r != slot + 1 for r in replies):
        # Masters that did not give it this slot may still queue it (a refusal, a reply lost):
        # a live entry there would hold back every later caller on that master until it expired.
        yield Round(("ZREM", want.queue_key, entry))
    if won:
        valid_until = start + want.ttl - protocol.drift(want.ttl, masters.drift_factor)
        found = failures(masters, as_votes) if result.failed else []
        return PermitGranted(valid_until, found, slot)
    return Lost(result, replies)


def mismatch(replies: Sequence[Reply]) -> str | None:
    """What a master found under the name instead of this semaphore, if one did."""
    for reply in replies:
        if isinstance(reply, list) and reply and reply[0] == -1:
            found = reply[1]
            return found.decode(errors="replace") if isinstance(found, bytes) else str(found)
    return None


def acquire(masters: Masters, want: PermitWant) -> Procedure[PermitWon]:
    """A permit: like ``procedures.acquire``, with a slot chosen from what the masters said.
    One waiter queue for the semaphore, locally and on the masters, in arrival order."""
    began = time.monotonic()
    asked_ms = now_ms()  # the waiter's place in the masters' queue: when it asked (client ms)
    deadline = began + want.wait
    attempts = switches = 0
    start_slot = first_slot(want)
    turn: Turn | None = None
    waiter: Waiter | None = None
    entry = ""  # the waiter's ``queue_entry``
    lost: Lost | None = None
    split_retried = False
    try:
        if want.wait > 0:
            turn = masters.queues.join((want.resource,))
            courtesy = masters.courtesy_until(want.resource) - began
            if courtesy > 0:
                yield Pause(min(courtesy, want.wait))
        while True:
            if turn is not None:
                first = yield AwaitTurn(turn, deadline - time.monotonic())
                if not first:
                    raise permit_not_acquired(masters, want, lost, attempts)
                if waiter is None and lost is not None:
                    waiter = yield Listen()
                    left_ms = max(int((deadline - time.monotonic()) * 1000), 1)
                    entry = queue_entry(waiter, now_ms() + left_ms)
            attempts += 1
            # A waiter starts from slot 0, as every waiter does: waiters admitted together (one
            # per free slot) then take different slots, by their places in the queue.
            first_slot_ = start_slot if waiter is None else 0
            outcome = yield from attempt(masters, want, first_slot_, entry, asked_ms)
            if isinstance(outcome, PermitGranted):
                return PermitWon(
                    outcome.valid_until, attempts, began, entry, outcome.failures, outcome.slot
                )
            lost = outcome
            found = mismatch(lost.replies)
            if found is not None:
                raise mismatch_error(want, found, lost, masters, attempts)
            start_slot = JITTER.randrange(want.limit)
            some_free = any(isinstance(r, int) and r >= 1 for r in lost.replies)
            if some_free and switches < SWITCHES:
                # Masters disagreed on the free slot (two acquirers at once): try again at once
                # from another slot (a try, not a wait; also with wait=0, whose "one attempt"
                # means "while a permit is free").
                switches += 1
                continue
            switches = 0
            now = time.monotonic()
            if now >= deadline:
                raise permit_not_acquired(masters, want, lost, attempts)
            if some_free and not split_retried:
                # Still split: try again shortly, with jitter, rather than sleep until a release.
                split_retried = True
                yield Pause(protocol.split_retry_delay(now - began, JITTER))
                continue
            if lost.result.contended and waiter is None and turn is not None:
                continue  # become a waiter (above), then try again: that try queues it
            if lost.result.contended and waiter is not None:
                split_retried = False
                yield from wait_turn(masters, waiter, lost, deadline)
                continue
            delay = protocol.retry_delay(masters.retry_delay, JITTER)
            expiry = free_in(lost.replies, masters.quorum)
            if expiry is not None:
                delay = min(delay, expiry + EXPIRY_MARGIN)
            if now + delay > deadline:
                raise permit_not_acquired(masters, want, lost, attempts)
            yield Pause(delay)
    except BaseException as exc:
        if entry and not isinstance(exc, GeneratorExit):
            # Leave the queue, also on timing out: a live entry holds back every later caller.
            yield Round(("ZREM", want.queue_key, entry), cleanup=True)
        raise
    finally:
        if turn is not None:
            masters.queues.leave(turn)


def permit_not_acquired(
    masters: Masters, want: PermitWant, lost: Lost | None, attempts: int
) -> Exception:
    held = f"all {want.limit} permits of {want.resource!r} are held"
    return not_acquired(masters, want, lost, attempts, contended=held)


def mismatch_error(
    want: PermitWant, found: str, lost: Lost, masters: Masters, attempts: int
) -> LockContended:
    what = described(found) or repr(found)
    return LockContended(
        want.resource,
        f"{want.resource!r} is asked for as a semaphore with limit={want.limit} and is held as "
        f"{what}: one resource must be used one way",
        failures(masters, lost.replies),
        attempts=attempts,
    )
