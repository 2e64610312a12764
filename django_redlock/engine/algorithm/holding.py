"""What a holder does with its lease, each written once as a procedure (see ``procedures``):
renew it (``extend``), ask the masters whether it is still ours (``holds``), give it back
(``release``, which tells the truth when it could not), leave it to lapse at a time of its own
(``finish``, for ``at_least``), and read its fencing tokens (``fence``).
"""

from __future__ import annotations

import math
import time

from ..base import protocol, values
from ..base.errors import UNAWAITED, ExtensionLimit, LockLost, NodeFailure, QuorumUnavailable
from ..leases.leases import Lease
from ..members.interface import Reply, RoundReplies
from ..scripts import plain as plain_scripts
from ..waiting.admission import holder_patience
from . import restarts
from .losses import gone, taken_away
from .procedures import COURTESY, JITTER, release_round, tally
from .steps import (
    Detach,
    Masters,
    Pause,
    Procedure,
    Round,
    confirms,
    failures,
    granted,
)


def extend(
    masters: Masters, lease: Lease, *, once: bool, ttl: float | None = None
) -> Procedure[float]:
    """Renew ``lease`` for ``ttl`` seconds (its own TTL if None; a new one becomes its TTL).
    With ``once`` (the watchdog's renewal), a single round: returns the new validity, or 0.0
    when this round failed but the lease is still valid (the watchdog tries again). Without,
    the holder's ``extend()``: retried until renewed or lost, and the watchdog is told of the
    lease's new schedule before the first round leaves.

    The extension is counted before the round is sent (``ExtensionLimit`` past
    ``max_extensions``, however a renewal and the holder's ``extend()`` overlap) and given back
    if no round renewed; one cut short (a timeout, a cancel, Ctrl-C) counts, since it may have
    renewed on the masters. A shorter TTL shortens the lease before its round leaves, and the
    last round sent decides (see ``Lease.begin_round`` and ``Lease.renewed``).

    A lease with a cap (``at_most``, ``max_hold``) is never renewed past it, however it is
    asked: the round's TTL is cut to reach the cap exactly, and once the cap is reached (less
    than the shortest lease left) ``ExtensionLimit`` says so and nothing is sent."""
    if lease.check_lost():
        raise lease.lost_error()
    capped(lease, lease.ttl if ttl is None else ttl)  # (refused before it counts as one)
    if not lease.reserve_extension():
        raise ExtensionLimit(
            lease.resource,
            f"lock {lease.resource!r} was extended {lease.extensions} times already: "
            f"max_extensions={lease.max_extensions}",
        )
    try:
        return (yield from _extend_rounds(masters, lease, once=once, ttl=ttl))
    except (LockLost, ExtensionLimit):
        lease.give_back_extension()  # it renewed nothing (the lease is lost, or at its cap)
        raise


def capped(lease: Lease, ttl: float) -> float:
    """``ttl``, cut so that a renewal sent now reaches no further than the lease's cap
    (``max_hold`` after it was taken: ``at_most``); ``ExtensionLimit`` once the cap is
    reached."""
    cap = lease.max_hold
    if cap is None:
        return ttl
    left = lease.acquired_at + cap - time.monotonic()
    if left < protocol.MIN_TTL:
        raise ExtensionLimit(
            lease.resource,
            f"lock {lease.resource!r} reached its cap (at_most/max_hold={cap:g}s after it was "
            f"taken): it is not renewed past it, and lapses within {lease.validity:.2f}s",
        )
    return min(ttl, left)


def _extend_rounds(
    masters: Masters, lease: Lease, *, once: bool, ttl: float | None
) -> Procedure[float]:
    while True:
        start = time.monotonic()
        if lease.check_lost():
            raise lease.lost_error()
        # Read at send time: a renewal sent after the holder's extend(ttl=) uses the new TTL.
        round_ttl = capped(lease, lease.ttl if ttl is None else ttl)
        generation, until = lease.begin_round(round_ttl, start, masters.drift_factor)
        if not once and lease.watcher is not None:
            lease.watcher.reschedule(lease)
        try:
            replies: list[Reply] = yield in_turn(
                Round(
                    plain_scripts.EXTEND.evalsha(lease.keys, (lease.value, int(round_ttl * 1000))),
                    plain_scripts.EXTEND,
                    enough=granted,  # decided by a quorum's renewals: returns then
                )
                if lease.commands is None
                else lease.commands.extend(lease, int(round_ttl * 1000)),
                lease,
            )
        finally:
            lease.settled(generation)
        if lease.released:
            lease.give_back_extension()
            return 0.0  # released meanwhile (the watchdog raced the holder): nothing to say
        result = tally(masters, replies, round_ttl, start)
        # Counts only if a quorum renewed it *before* the old lease ran out: after that,
        # someone else may have held the lock in between, and renewing would hide it.
        if result.won and (lease.renewed(generation, until) or generation != lease.generation):
            # Renewed; or renewed but overtaken: a round sent after ours decides the lease.
            if result.failed:
                lease.note_failures(failures(masters, replies), "extend")
            return lease.validity
        if result.lost:
            raise taken_away(masters, lease, result, replies)
        delay = protocol.retry_delay(masters.retry_delay, JITTER)
        if time.monotonic() + delay >= lease.valid_until:
            raise lease.mark_lost(
                f"could not renew lock {lease.resource!r} on a quorum before its lease ran out",
                gone(masters, replies),
            )
        if once:
            lease.give_back_extension()
            return 0.0
        yield Pause(delay)


def in_turn(round_: Round, lease: Lease) -> Round:
    """``round_``, a release or renewal of ``lease``, lets the acquisitions of this process
    queued before it go first for a while (``admission.holder_patience``): their callers asked
    first, and the lease still has ten times that left."""
    round_.behind = holder_patience(lease.valid_until)
    return round_


def holds(masters: Masters, lease: Lease) -> Procedure[bool]:
    """Whether a quorum of masters still holds our value (every key of it), within the lease's
    validity. Marks the lease lost when so many say it is gone that no quorum can hold it."""
    start = time.monotonic()
    if lease.released or lease.check_lost():
        return False
    replies: list[Reply] = yield Round(
        plain_scripts.HOLDS.evalsha(lease.keys, (lease.value,)), plain_scripts.HOLDS
    )
    result = tally(masters, replies, lease.ttl, start)
    if result.lost:
        taken_away(masters, lease, result, replies)
        return False
    return result.granted >= masters.quorum and not lease.check_lost()


def release(masters: Masters, lease: Lease) -> Procedure[None]:
    """Compare-and-delete on every master and wake the next waiter in each resource's queue.
    Raises ``LockLost`` (after still removing our lease wherever it is ours) unless a quorum
    confirmed that it removed *our* lease: it had run out, was released by force, or too few
    masters answered; or if the lease was found lost before (told then, said again now). A
    master asked again after a reset connection, that finds our lease already gone, confirms
    (the first request may have removed it), unless it restarted since the grant
    (``restarts.read_release``)."""
    if lease.commands is None:
        round_ = release_round(
            masters, lease.resources, lease.value, queued_as=lease.queued_as, at_quorum=True
        )
    else:
        round_ = lease.commands.release(lease)
    try:
        answered: RoundReplies = yield in_turn(round_, lease)
    except BaseException:
        # Interrupted (a cancelled task): finish the release, shielded, before letting the
        # interruption through, so that a cancellation never leaves the lock held.
        yield Round(round_.command, round_.script, cleanup=True)
        raise
    several = len(lease.keys)
    replies: list[Reply] = answered
    # Masters whose "gone" is no confirmation (restarted since the grant, ``restarts``): looked
    # for only when the replies alone did not confirm it and some master was asked again (or
    # abstains): never on the usual release.
    restarted: dict[int, NodeFailure] | None = None
    while True:
        # One pass over the replies (every release's hot path): how many confirmed, how many
        # masters did not answer, and the highest count of keys-plus-woken a master returned.
        # (``reported``: those of them that failed, not only went unawaited once a quorum
        # confirmed.) The rule of ``steps.confirms`` is written out: through it (and ``max``), a
        # release cost 10.3k instructions more, 2.5% of a cycle.
        confirmed = unanswered = reported = highest = 0
        one = several == 1  # one key: 1 + the waiters woken confirms it; several: exactly several
        for r in replies:
            if isinstance(r, int):
                if r == several or (one and r > 0):
                    confirmed += 1
                if r > highest:
                    highest = r
            elif isinstance(r, NodeFailure):
                unanswered += 1
                reported += r.reason != UNAWAITED
        if (
            confirmed >= masters.quorum
            or restarted is not None
            or not (answered.asked_again or masters.quarantine)
        ):
            break
        replies, restarted = restarts.read_release(masters, lease, answered, several)
    if (
        confirmed < masters.quorum  # (first: the usual release is confirmed, and needs no call)
        and lease.commands is None
        and _worth_retrying(masters, lease, confirmed, unanswered)
    ):
        # Its keys must not block everyone until their TTL: retried in the background.
        yield Detach(_keep_releasing(masters, lease, round_, replies))
    if several == 1 and highest - 1 > 0:  # a master woke a waiter: let it go first
        masters.give_way(lease.resource, COURTESY)
    if confirmed < masters.quorum:
        detail = gone(masters, replies, several=several, known=restarted)
        if time.monotonic() >= lease.valid_until:
            raise lease.mark_lost(lease.lost_message(), detail)
        if sum(f.reason == "gone" for f in detail) > len(replies) - masters.quorum:
            came_back = sum(f.reason == "gone" for f in (restarted or {}).values())
            raise lease.mark_lost(
                f"lock {lease.resource!r} was not released by a quorum: {confirmed} of "
                f"{len(replies)} masters still held our lease ({masters.quorum} needed): "
                + (
                    f"{came_back} of them restarted (or failed over) since the grant, empty"
                    if came_back
                    else "it was released by force, or lost by masters"
                ),
                detail,
            )
        if lease.lost:  # found lost before, and told then: said again, not as unconfirmed
            raise lease.lost_error()
        lease.note_failures(detail, "release")
        raise LockLost(
            lease.resource,
            f"release of lock {lease.resource!r} not confirmed: only {confirmed} of "
            f"{len(replies)} masters confirmed it ({masters.quorum} needed); the lease was valid "
            f"until now; it is retried in the background until the lease's keys expire (within "
            f"its TTL, {lease.ttl}s)",
            detail,
            unconfirmed=True,
        )
    if reported:
        lease.note_failures(failures(masters, replies), "release")
    if lease.lost:
        # Found lost before (the watchdog, its expiry watch, ``check()``: told then): whatever
        # the masters confirmed now, exclusivity was not kept to the end. Said again, not told.
        raise lease.lost_error()


def _keep_releasing(
    masters: Masters, lease: Lease, round_: Round, replies: list[Reply]
) -> Procedure[None]:
    """A release that too few masters confirmed while some did not answer, sent again (a retry
    delay apart, waiting for every master) until each of them answered or the lease's keys
    expire: no key of ours is left to block anyone. A compare-and-delete is idempotent:
    repeating it never removes anything but ours. (Not started when enough masters said our
    lease is not there: nothing to remove.) The caller does not wait for it: it was told the
    release is unconfirmed, within the same time as before."""
    again = Round(round_.command, round_.script)
    while any(isinstance(r, NodeFailure) for r in replies) and time.monotonic() < lease.valid_until:
        yield Pause(protocol.retry_delay(masters.retry_delay, JITTER))
        replies = _merge(lease, replies, (yield again))


def _worth_retrying(masters: Masters, lease: Lease, confirmed: int, unanswered: int) -> bool:
    """Whether a release that ``confirmed`` masters confirmed, ``unanswered`` did not answer, is
    to be sent again: not confirmed by a quorum, but it could be once those answer."""
    return (
        confirmed < masters.quorum
        and confirmed + unanswered >= masters.quorum
        and time.monotonic() < lease.valid_until
    )


def _merge(lease: Lease, before: list[Reply], after: list[Reply]) -> list[Reply]:
    """Per master: a confirmation stands; an answer replaces a failure. A master that failed to
    answer the first time and now finds nothing counts as confirmed: while the lease was
    valid, no one else could remove it, so our unanswered request did (either way, nothing of
    ours is left there)."""
    confirmed = confirms(len(lease.keys))
    full = len(lease.keys)
    merged: list[Reply] = []
    for old, new in zip(before, after, strict=True):
        if confirmed(old) or isinstance(new, NodeFailure):
            merged.append(old)
        elif isinstance(old, NodeFailure) and not confirmed(new):
            merged.append(full)
        else:
            merged.append(new)
    return merged


def let_go(masters: Masters, lease: Lease, at_least: float | None) -> Procedure[None]:
    """``release``, or, before ``at_least`` has passed since the acquisition, ``finish``: keep
    the key until then (plus the drift allowance: the masters' clocks may run fast)."""
    if at_least is None:
        # (``release`` itself, not a generator around it: every send of the cycle's release
        # passed through that one more frame, ~1k CPU instructions a release.)
        return release(masters, lease)
    return _finish_or_release(masters, lease, at_least)


def _finish_or_release(masters: Masters, lease: Lease, at_least: float) -> Procedure[None]:
    """``let_go`` with an ``at_least``: decided when it starts (its round's turn came)."""
    if not lease.lost:
        keep = lease.acquired_at + at_least - time.monotonic()
        if keep > 0:
            keep += protocol.drift(at_least, masters.drift_factor)
            return (yield from finish(masters, lease, keep))
    return (yield from release(masters, lease))


def finish(masters: Masters, lease: Lease, keep: float) -> Procedure[None]:
    """Instead of releasing: keep our key on every master for ``keep`` more seconds, unrenewed,
    marked finished (compare-and-set: only where it still holds our value), then let it lapse
    by itself. Nothing of ours runs after this. Raises ``LockLost`` as ``release`` does when a
    quorum did not confirm it: then where it remains, it lapses within its TTL."""
    keep_ms = max(1, math.ceil(keep * 1000))
    finished = values.finished_value(lease.value, time.time() + keep)
    queues = tuple(masters.queue_key(r) for r in lease.resources)
    command = plain_scripts.FINISH.evalsha(
        lease.keys + queues, (lease.value, keep_ms, finished, lease.queued_as)
    )
    try:
        replies: list[Reply] = yield in_turn(Round(command, plain_scripts.FINISH), lease)
    except BaseException:
        yield Round(command, plain_scripts.FINISH, cleanup=True)  # as release: never left half done
        raise
    confirmed = sum(r == 1 for r in replies)
    if confirmed >= masters.quorum:
        if any(isinstance(r, NodeFailure) for r in replies):
            lease.note_failures(failures(masters, replies), "finish")
        if lease.lost:  # (found lost meanwhile, and told: as ``release``)
            raise lease.lost_error()
        return
    detail = gone(masters, replies)
    if (
        time.monotonic() >= lease.valid_until
        or sum(f.reason == "gone" for f in detail) > len(replies) - masters.quorum
    ):
        raise lease.mark_lost(lease.lost_message(), detail)
    lease.note_failures(detail, "finish")
    raise LockLost(
        lease.resource,
        f"finishing lock {lease.resource!r} (kept until its at_least) not confirmed: only "
        f"{confirmed} of {len(replies)} masters confirmed it ({masters.quorum} needed); where "
        f"it remains it lapses within its TTL ({lease.ttl}s)",
        detail,
        unconfirmed=True,
    )


def fence(masters: Masters, lease: Lease, resource: str) -> Procedure[int]:
    """The lease's fencing token for ``resource``: a quorum's counters, max + 1, written back
    to a quorum before use (a majority max-register), so that any later reading quorum sees
    it."""
    token = None if lease.fences is None else lease.fences.get(resource)
    if token is not None:
        return token
    fence_key = masters.fence_key(resource)
    replies: list[Reply] = yield Round(("GET", fence_key))
    counters = [None if isinstance(r, NodeFailure) else int(r or 0) for r in replies]  # type: ignore[call-overload]
    token = protocol.fence_merge(counters, len(masters.nodes))
    if token is None:
        raise fence_unavailable(masters, lease, replies)
    replies = yield Round(
        plain_scripts.FENCE_RAISE.evalsha((fence_key,), (token,)), plain_scripts.FENCE_RAISE
    )
    if sum(not isinstance(r, NodeFailure) for r in replies) < masters.quorum:
        raise fence_unavailable(masters, lease, replies)
    if lease.check_lost():
        raise lease.lost_error()
    if lease.fences is None:
        lease.fences = {}
    lease.fences[resource] = token
    return token


def fence_unavailable(masters: Masters, lease: Lease, replies: list[Reply]) -> QuorumUnavailable:
    return QuorumUnavailable(
        lease.resource,
        f"lock {lease.resource!r}: no quorum of masters answered for its fencing token",
        failures(masters, replies),
    )
