"""What a procedure can ask the drivers for (its *steps*), what it needs of the engine
(``Masters``), and how to read the masters' replies (votes, per-master detail, when a held lease
will have run out)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..base.errors import UNAWAITED, NodeFailure
from ..base.protocol import Vote
from ..members.interface import Command, Node, Reply
from ..scripts import plain as plain_scripts
from ..waiting.admission import Admission
from ..waiting.local_queues import LocalQueues, Turn
from ..waiting.notices import ReleaseNotices
from ..waiting.waiter import Waiter

T = TypeVar("T")


class Watching(Protocol):
    """What the drivers need of the watchdog (``running.watchdog.Watchdog``): that it runs."""

    def ready(self) -> None: ...


class Masters(Protocol):
    """What the procedures need of a ``Redlock``."""

    nodes: tuple[Node, ...]
    quorum: int
    node_timeout: float
    drift_factor: float
    retry_delay: float
    #: Restart and failover quarantine on (``quarantine``): members may abstain.
    quarantine: bool
    queues: LocalQueues
    inbox_prefix: str
    admission: Admission

    @property
    def watchdog(self) -> Watching: ...

    @property
    def notices(self) -> ReleaseNotices: ...

    def queue_key(self, resource: str) -> str: ...
    def fence_key(self, resource: str) -> str: ...
    def release_command(
        self,
        resources: Sequence[str],
        value: str | bytes,
        *,
        notify: bool = True,
        queued_as: str = "",
    ) -> tuple[Command, plain_scripts.Script]: ...
    def give_way(self, resource: str, seconds: float) -> None: ...
    def courtesy_until(self, resource: str) -> float: ...


# --- the steps a procedure can ask for ------------------------------------------------------------


# (Not frozen, as ``protocol.Tally``: made every round.)
@dataclass(slots=True, repr=False)
class Round:
    """Send ``command`` to every master at once; the answer is the list of their replies."""

    command: Command
    script: plain_scripts.Script | None = None
    #: Clean-up after an interruption: the async runner shields it from a second cancellation.
    cleanup: bool = False
    #: An acquisition's: it waits for its turn among this process's rounds (``admission``) at
    #: most this long. None: a holder's round, which waits as long as it takes, ahead of every
    #: acquisition but those queued before it, for ``behind`` seconds at most (a release's or
    #: renewal's: ``admission.holder_patience``).
    patience: float | None = None
    behind: float = 0.0
    #: Which answers decide the round: it returns once a quorum of them came (``exchange``).
    enough: Callable[[object], bool] | None = None

    def __repr__(self) -> str:
        # Never the arguments: they carry the lock's value, and error pages and trackers that
        # capture frame locals would show its token.
        name = self.command[0] if self.script is None else self.script.name
        return f"<Round {name}{' (clean-up)' if self.cleanup else ''}>"


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Listen:
    """Become a waiter that releases can wake by name; the answer is a ``Waiter``, returned once
    a quorum of masters confirmed our inbox subscription (or after one NODE_TIMEOUT)."""


@dataclass(frozen=True, slots=True)
class AwaitNotice:
    """Sleep until a release wakes ``waiter``, or ``timeout``; answers True if one did."""

    waiter: Waiter
    timeout: float


@dataclass(frozen=True, slots=True)
class AwaitTurn:
    """Sleep until ``turn`` is first among this process's waiters, or ``timeout``; answers True
    if it is."""

    turn: Turn
    timeout: float


@dataclass(frozen=True, slots=True)
class Detach:
    """Go on with ``procedure`` in the background (a task on the running loop, or a thread of
    its own), without waiting for it: work the caller should not wait for, that may not be
    dropped either (a release retried until the lease's keys expire)."""

    procedure: Generator[Any, Any, Any]


Step = Round | Pause | Listen | AwaitNotice | AwaitTurn | Detach
Procedure = Generator[Step, Any, T]


# --- votes --------------------------------------------------------------------------------------


_GRANTED, _DENIED, _FAILED = Vote.GRANTED, Vote.DENIED, Vote.FAILED


def vote(reply: Reply) -> Vote:
    """SET NX answers OK or nil; our scripts answer 0 (or, for a waiter, [0, pttl]) for 'not
    ours' and >= 1 for done."""
    kind = type(reply)  # the usual answers first: this runs for every reply of every round
    if kind is bytes:
        return _GRANTED
    if kind is int:
        return _GRANTED if reply else _DENIED
    if isinstance(reply, NodeFailure):
        return _FAILED
    if reply is None or reply == 0 or isinstance(reply, list):
        return _DENIED
    return _GRANTED


def granted(reply: object) -> bool:
    """Whether an answer grants what was asked (decides a round: see ``Round.enough``)."""
    kind = type(reply)  # (as ``vote``: the usual answers without its call)
    if kind is bytes:
        return True
    if kind is int:
        return reply != 0
    return vote(reply) is _GRANTED


def grants(replies: Sequence[Reply]) -> tuple[int, list[NodeFailure]]:
    """One pass over an acquisition's replies (every acquisition's hot path): how many masters
    granted it (as ``vote`` reads them), and those that failed (not those only unawaited once a
    quorum granted it: ``failures`` without refusals). All that a won round needs; a lost one is
    tallied in full (``procedures.tally``)."""
    count = 0
    failed: list[NodeFailure] = []
    for reply in replies:
        kind = type(reply)  # (the usual answers first, as ``vote``, without its call)
        if kind is bytes:
            count += 1
        elif kind is int:
            if reply:
                count += 1
        elif isinstance(reply, NodeFailure):
            if reply.reason != UNAWAITED:
                failed.append(reply)
        elif vote(reply) is _GRANTED:
            count += 1
    return count, failed


# The deciders (``Round.enough``) of every cycle's two rounds, as C callables, and the votes
# above read from module names, not ``Vote.X`` (an enum member's lookup): together they save
# 56k instructions over a cycle's votes (callgrind, each answer decided twice), 13%. Called for
# each answer of each round (by the round, by the driver). A round calls them with answers only
# (bytes, int, list or None: ``slots.ANSWERS``; failures and errors never), and each is exact
# for the answers its command can give (``confirms`` and ``granted`` take any reply, for the
# other rounds).
#: ``SET NX PX`` answers OK (granted) or nil (held): granted iff not nil.
SET_GRANTED = functools.partial(operator.is_not, None)
#: ``RELEASE`` (one resource) answers 0 (not ours) or 1 + the waiters woken: confirmed iff > 0.
RELEASED_ONE = functools.partial(operator.lt, 0)


def _confirms_one(reply: object) -> bool:
    return isinstance(reply, int) and reply >= 1


def confirms(several: int) -> Callable[[object], bool]:
    """Whether a master's answer to a release confirms it removed our lease (every key of it)."""
    if several == 1:
        return _confirms_one
    return lambda reply: reply == several


def confirms_answer(several: int) -> Callable[[object], bool]:
    """``confirms`` for a release's answers only (ints: a round's decider, or its replies once
    failures are set apart), in C for the usual one key (``RELEASED_ONE``)."""
    return RELEASED_ONE if several == 1 else confirms(several)


def failures(
    masters: Masters, replies: Sequence[Reply], *, refusals: bool = True
) -> list[NodeFailure]:
    """Per-master detail for errors: who failed and why, and who said the lock is held. Without
    ``refusals``, only who failed: of a won round, all that ``Lease.note_failures`` reports."""
    out = []
    if not refusals:  # (every won round: a loop, not a comprehension's function made each time)
        for reply in replies:
            if isinstance(reply, NodeFailure) and reply.reason != UNAWAITED:
                out.append(reply)
        return out
    for node, reply in zip(masters.nodes, replies, strict=True):
        if isinstance(reply, NodeFailure):
            if reply.reason != UNAWAITED:  # not a failure: the round did not wait for it
                out.append(reply)
        elif vote(reply) is Vote.DENIED:
            out.append(NodeFailure(node.label, "held"))
    return out


def free_in(replies: Sequence[Reply], quorum: int) -> float | None:
    """Seconds until the holder's lease has run out on a quorum of masters, from the PTTLs that
    waiters' attempts return; None if too few masters said."""
    ttls = sorted(r[1] / 1000 for r in replies if isinstance(r, list) and r[1] >= 0)
    needed = quorum - sum(vote(r) is Vote.GRANTED for r in replies)
    if needed <= 0:
        return 0.0
    return ttls[needed - 1] if len(ttls) >= needed else None
