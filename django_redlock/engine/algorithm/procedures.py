"""THE ALGORITHM: acquire (``attempt``, the paper's five steps, plus ``acquire``'s waiting beside
it), extend, release and fence, each written once as a *procedure*: a generator that yields the
I/O it needs (a ``Round`` of one request per master, a ``Pause``, a notice or a local turn to
wait for) and receives the answers. ``drivers.run`` performs those steps with threads,
``drivers.arun`` with asyncio; every decision is this code, and the pure parts are ``protocol``.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..base import protocol
from ..base.errors import NodeFailure
from ..base.protocol import Tally
from ..members.interface import Reply, RoundReplies
from ..scripts import plain as plain_scripts
from ..waiting import admission
from ..waiting.admission import Full
from ..waiting.local_queues import Turn
from ..waiting.waiter import Waiter
from .handoff import handed_over, queued_as
from .refusals import not_acquired, overloaded
from .steps import (
    SET_GRANTED,
    AwaitNotice,
    AwaitTurn,
    Listen,
    Masters,
    Pause,
    Procedure,
    Round,
    confirms_answer,
    free_in,
    granted,
    grants,
    vote,
)

#: Jitter for retries (one per process: seeding one per lock cost ~8 us and ~3 KB). Tokens never
#: come from here but from ``secrets``.
JITTER = random.Random()  # noqa: S311
# Forked children must not all draw the same "random" delays as their parent and each other.
os.register_at_fork(after_in_child=JITTER.seed)

#: A process that released a lock other processes were waiting for stays out of the next round
#: for this long, so that the waiter it woke gets the lock instead of the releaser barging back in.
COURTESY = 0.003

#: A queued waiter with no notice looks again after at most this long (a lost notice, a master
#: that restarted): a slow safety poll, not the way it normally learns its turn.
SAFETY_POLL = 1.0

#: A waiter that some master cannot tell yet (its inbox subscription unconfirmed there) looks
#: again after this long (see ``wait_turn``).
UNHEARD_POLL = 0.05

#: A waiter whose rounds keep finding some masters free (a split vote) looks again after this
#: long, then twice as long each time (see ``acquire``).
SPLIT_POLL = 0.01

#: Woken when the holder's lease can have run out on a quorum, plus this margin (the masters
#: expire keys on their own clocks, to the millisecond).
EXPIRY_MARGIN = 0.003


# --- acquire ------------------------------------------------------------------------------------


# (Not frozen, as ``protocol.Tally``: made every round.)
@dataclass(slots=True)
class Want:
    """One acquisition's request: what to lock (one resource, or several: all or none on each
    master), for how long, how long to wait."""

    resource: str  # the name (several: joined, for messages and the local waiter queue)
    resources: tuple[str, ...]
    keys: tuple[str, ...]
    ttl: float
    wait: float
    value: str = field(repr=False)  # the token: never in a repr (error pages show locals)
    #: ``value`` in the parts a held lease keeps (``values.compact_value``), as it was made
    #: (``values.new_value``): in a burst its lease is made a thousand values later. None: read
    #: back from the value when the lease is made.
    parts: tuple[bytes, str] | None = field(default=None, repr=False)

    @property
    def several(self) -> bool:
        return len(self.keys) > 1


@dataclass(slots=True)
class Won:
    """A won acquisition: its validity deadline, and how it went."""

    valid_until: float
    attempts: int
    began: float
    queued_as: str
    failures: list[NodeFailure]


@dataclass(slots=True)
class Granted:
    """A won attempt: until when its lease is exclusively ours (monotonic), and the masters
    that failed meanwhile (a minority, or it would not have been won)."""

    valid_until: float
    failures: list[NodeFailure]


@dataclass(slots=True)
class Lost:
    """A lost attempt: the tally and what each master said."""

    result: Tally
    replies: list[Reply]


def attempt(
    masters: Masters, want: Want, waiter: Waiter | None, deadline: float
) -> Procedure[Granted | Lost]:
    """The paper's five steps, once.

    1. Read the monotonic clock: ``RoundReplies.began``, read by the round just before its first
       request was written (after its turn among this process's rounds, ``admission``, and a
       busy loop tick), so that time spent queued here costs neither the validity nor the
       masters' node budget.
    2. SET the value NX PX ttl on every master at once, each within the node budget (a waiter
       uses a script that also queues it, on the masters that refuse, to be woken in turn).
       The round returns as soon as a quorum granted it, without waiting for the others.
    3. Won iff a quorum granted it and validity = ttl - elapsed - drift is left.
    4. Otherwise undo it on every master, those that failed included (a SET that timed out may
       still have landed, and would block others until its TTL).
    5. (``acquire``) retry after a random delay, or when woken.
    """
    now = time.monotonic()
    request = attempt_round(masters, want, waiter, deadline, now)
    try:
        replies: RoundReplies = yield request
    except Full as full:  # nothing was sent: nothing to undo
        raise overloaded(want, full) from None
    except BaseException:
        # Interrupted (task cancelled, Ctrl-C) while SETs were in flight: some may have landed.
        # Undo them on every master before letting the interruption through.
        yield release_round(masters, want.resources, want.value, cleanup=True, notify=False)
        raise
    if waiter is not None and waiter.queued_since is None:
        waiter.queued_since = replies.began  # 1
    result = judged(masters, want, replies)  # 3
    if isinstance(result, Granted):
        return result
    if result.granted or result.failed:  # 4
        if waiter is not None:
            waiter.trusts_hand_offs = False
        yield release_round(masters, want.resources, want.value, notify=False)
    return Lost(result, replies)


def judged(masters: Masters, want: Want, replies: RoundReplies) -> Granted | Tally:
    """Step 3 of ``attempt`` (and ``acquire_once``): won iff a quorum granted it and validity =
    ttl - elapsed - drift > 0, that is, now is before start + ttl - drift, with start the round's
    ``began`` (step 1): ``Granted``; else the round's tally. (One pass over the replies when it
    is won; a lost round is tallied in full.)"""
    start = replies.began
    count, failed = grants(replies)
    if count >= masters.quorum:
        valid_until = start + want.ttl - protocol.drift(want.ttl, masters.drift_factor)
        if time.monotonic() < valid_until:
            return Granted(valid_until, failed)
    return tally(masters, replies, want.ttl, start)


def attempt_round(
    masters: Masters, want: Want, waiter: Waiter | None, deadline: float, now: float
) -> Round:
    """Step 2 of ``attempt``, made at ``now``: the round that asks every master for it."""
    # Its turn among this process's rounds: within what is left of its wait (a single
    # attempt: within admission.PATIENCE), else Overloaded.
    patience = deadline - now if want.wait > 0 else admission.PATIENCE
    ttl_ms = int(want.ttl * 1000)
    script: plain_scripts.Script | None
    if waiter is None and want.several:  # 2 (all or none on each master, in one script)
        script, enough = plain_scripts.MULTI_ACQUIRE, granted
        command = script.evalsha(want.keys, (want.value, ttl_ms))
    elif waiter is None:
        script, enough = None, SET_GRANTED
        command = ("SET", want.keys[0], want.value, "NX", "PX", ttl_ms)
    elif want.several:
        wait_ms = max(int((deadline - now) * 1000), 1)
        queues = tuple(map(masters.queue_key, want.resources))
        # The notice it may send to pass a turn on: unique per attempt, so that a waiter woken
        # by an earlier one hears it too (notices are told apart by their digest).
        notice = protocol.notice_digest(f"{want.value}@{now}")
        script, enough = plain_scripts.MULTI_ACQUIRE_WAITING, granted
        command = script.evalsha(
            want.keys + queues,
            (want.value, ttl_ms, queued_as(want, waiter), wait_ms, notice, masters.inbox_prefix),
        )
    else:
        wait_ms = max(int((deadline - now) * 1000), 1)
        queue = masters.queue_key(want.resources[0])
        if waiter.score is None:  # once: the same number on every master, every round
            waiter.score = int(time.time() * 1000) + wait_ms
        script, enough = plain_scripts.ACQUIRE_WAITING, granted
        command = script.evalsha(
            (want.keys[0], queue),
            (want.value, ttl_ms, queued_as(want, waiter), wait_ms, waiter.score),
        )
    return Round(command, script, patience=patience, enough=enough)


def acquire_once(masters: Masters, want: Want) -> Procedure[Won]:
    """``acquire`` with no wait (``wait=0``, the default): ``attempt`` once, as ``acquire`` would,
    in one generator rather than ``acquire``'s around ``attempt``'s (saves 3.0k instructions an
    engine cycle, 7.2k through ``redlock()``, 1.7%; kept for issue 37's budget). The steps are
    ``attempt``'s without a waiter; see there."""
    began = time.monotonic()
    request = attempt_round(masters, want, None, began, began)
    try:
        replies: RoundReplies = yield request
    except Full as full:  # nothing was sent: nothing to undo
        raise overloaded(want, full) from None
    except BaseException:  # (as ``attempt``: undo what may have landed, then let it through)
        yield release_round(masters, want.resources, want.value, cleanup=True, notify=False)
        raise
    result = judged(masters, want, replies)
    if isinstance(result, Granted):
        return Won(result.valid_until, 1, began, "", result.failures)
    if result.granted or result.failed:
        yield release_round(masters, want.resources, want.value, notify=False)
    raise not_acquired(masters, want, Lost(result, replies), 1)


def acquire(masters: Masters, want: Want) -> Procedure[Won]:
    """Attempt, and while ``want.wait`` lasts, wait for a turn and attempt again. Waiting:
    this process's waiters of one resource queue up locally, and only the first competes on
    the masters, as a queued waiter that a release wakes by name; it also wakes when the
    holder's lease can have run out (the masters told its PTTL), or after a slow safety poll.
    A lock over several resources waits the same way, in the queue of each of its resources
    (see ``LocalQueues`` and ``scripts.plain.MULTI_ACQUIRE_WAITING``)."""
    began = time.monotonic()
    deadline = began + want.wait
    attempts = 0
    turn: Turn | None = None
    waiter: Waiter | None = None
    lost: Lost | None = None
    splits = 0  # rounds lost in a row with some masters free
    behind = False  # our release just handed the lock on: we wait as soon as we ask
    try:
        if want.wait > 0:
            # In line with this process's other waiters of the resource, before any I/O: only
            # the first of them competes on the masters, and they get it in arrival order.
            turn = masters.queues.join(want.resources)
            courtesy = max(map(masters.courtesy_until, want.resources)) - began
            if courtesy > 0:
                # We just woke a waiter by releasing this lock: let it go first (the masters
                # handed it the lock; its process needs the CPU to take it), then queue behind
                # it at once: a plain attempt could only lose, a round for nothing.
                behind = True
                yield Pause(min(courtesy, want.wait))
        while True:
            if turn is not None:
                first = yield AwaitTurn(turn, deadline - time.monotonic())
                if not first:
                    raise not_acquired(masters, want, lost, attempts)
                if waiter is None and (lost is not None or behind):
                    # It lost once (or stands behind the holder its release just handed the
                    # lock to): a waiter from now on, that releases wake by name. (Then it
                    # tries again: that try queues it on the masters if it loses, and a release
                    # in between cannot be missed, since the next try then finds it free.)
                    waiter = yield Listen()
            attempts += 1
            outcome = yield from attempt(masters, want, waiter, deadline)
            if isinstance(outcome, Granted):
                queued = "" if waiter is None else queued_as(want, waiter)
                return Won(outcome.valid_until, attempts, began, queued, outcome.failures)
            lost = outcome
            now = time.monotonic()
            if now >= deadline:
                raise not_acquired(masters, want, lost, attempts)
            if lost.result.contended and waiter is None:
                continue  # become a waiter, then try again (above)
            if lost.result.contended and waiter is not None:
                # Some masters were free: perhaps a split vote with other waiters and no holder
                # (they all undid theirs), so no release would wake any of us. Try once more
                # shortly, older waiters first; split again, look again within SPLIT_POLL,
                # twice as long each time after that (a holder on a bare quorum looks the
                # same, and its waiters must not poll it hard), but never a safety poll's
                # sleep: a split that repeats (queues that disagree) would stall every waiter.
                splits = splits + 1 if lost.result.granted else 0
                if splits == 1:
                    yield Pause(protocol.split_retry_delay(now - began, JITTER))
                    continue
                most = SPLIT_POLL * 2 ** min(splits - 2, 7) if splits else SAFETY_POLL
                yield from wait_turn(masters, waiter, lost, deadline, most)
                handed = yield from handed_over(masters, want.ttl, waiter)
                if handed is not None:
                    return Won(handed, attempts, began, queued_as(want, waiter), [])
                continue
            delay = protocol.retry_delay(masters.retry_delay, JITTER)  # 5
            if now + delay > deadline:
                raise not_acquired(masters, want, lost, attempts)
            yield Pause(delay)
    except BaseException as exc:
        if waiter is not None and not isinstance(exc, GeneratorExit):
            # Gone from the wait (interrupted, or out of time) as a waiter: leave the masters'
            # queues, or the next release would wake (or hand the lock to) a name no one answers
            # to any more; a release of our value also passes on a key handed to us meanwhile
            # (else it would stay with no one until its TTL). One round for every resource.
            yield release_round(
                masters, want.resources, want.value, cleanup=True, queued_as=queued_as(want, waiter)
            )
        raise
    finally:
        if turn is not None:
            masters.queues.leave(turn)  # the next local waiter's turn


def wait_turn(
    masters: Masters, waiter: Waiter, lost: Lost, deadline: float, most: float = SAFETY_POLL
) -> Procedure[None]:
    """Sleep until a release names ``waiter``, or the holder's lease can have run out on a
    quorum (the masters told their PTTL), or at most ``most`` (the safety poll); never past
    ``deadline``. While some master has not confirmed our inbox yet (a process's first wait, on
    a busy machine), a release there skips us and we leave its queue: then look again within
    UNHEARD_POLL."""
    expiry = free_in(lost.replies, masters.quorum)
    sleep = most if expiry is None else min(expiry + EXPIRY_MARGIN, most)
    if not masters.notices.heard_everywhere():
        sleep = min(sleep, UNHEARD_POLL)
    yield AwaitNotice(waiter, min(sleep, deadline - time.monotonic()))


def tally(masters: Masters, replies: Sequence[Reply], ttl: float, start: float) -> Tally:
    return protocol.tally(
        list(map(vote, replies)),  # (map: no comprehension's function made on every round)
        ttl=ttl,
        elapsed=time.monotonic() - start,
        drift_factor=masters.drift_factor,
    )


# --- extend, release, fence ---------------------------------------------------------------------


def release_round(
    masters: Masters,
    resources: tuple[str, ...],
    value: str,
    *,
    cleanup: bool = False,
    notify: bool = True,
    queued_as: str = "",
    at_quorum: bool = False,
) -> Round:
    """``at_quorum``: the round returns once a quorum confirmed it (the holder's release; the
    undoing of a failed attempt waits for every master's answer, within the budget)."""
    command, script = masters.release_command(resources, value, notify=notify, queued_as=queued_as)
    enough = confirms_answer(len(resources)) if at_quorum else None
    return Round(command, script, cleanup, enough=enough)
