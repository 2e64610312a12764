"""Replica acknowledgement of a member's grants: a member URL with ``?wait_replicas=1&wait_timeout=
0.02`` has its votes count only once that many of its replicas acknowledged the write.

Why: a member that is a primary with replicas (a Sentinel-managed one, a managed Redis) can fail
over to a replica that had not received our key yet (replication is asynchronous), and then grant
the lock again. ``WAIT numreplicas timeout_ms`` blocks until that many replicas acknowledged every
write made so far on its connection, or until the timeout, and answers how many did.

How: ``WAIT`` goes right behind the request (the acquire, extend or fence write: a script marked
``acked``, or the acquisition's ``SET``) in the same write on the same pipelined connection, so it
costs no extra round trip: two replies come back, and the round sees one answer (``Acked``): the
request's, if enough replicas acknowledged it, else a failed vote, reason ``"replica ack"``
("0/1 replicas acknowledged within 0.02 s"). What the request wrote stays on the member and is
cleaned up as after any failed vote (a failed attempt's release, the holder's). After a missed
acknowledgement the member sits out grants for ``SIT_OUT`` (not asked: a failed vote saying so).
Other requests (releases, reads) go without ``WAIT``. ``WAITAOF`` (Redis 7.2) is not used: the
servers we test on run 7.0.

A member's ``wait_timeout`` must fit inside the per-node budget (``NODE_TIMEOUT``), or the reply
of a member whose replicas are down would come after its budget, as a timeout.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import hiredis

from ..base.errors import NodeFailure
from ..scripts.plain import Script
from .pipes import Pipe
from .slots import PENDING, Broken, Slot

#: The ``NodeFailure.reason`` of a vote that too few replicas acknowledged.
REASON = "replica ack"

#: After a vote its replicas did not acknowledge, the member sits out grants this long: its
#: replicas are most likely still missing, and each such request would hold its connection for
#: ``wait_timeout`` (Redis runs what follows a blocked ``WAIT`` only after it), so that a busy
#: process would pile up requests there faster than the member can answer them.
SIT_OUT = 1.0

#: Seconds since a replica's last acknowledgement (INFO's ``lag``: replicas acknowledge every
#: second) past which it is taken for one that does not acknowledge (paused, cut off).
ACK_LAG = 2

REPLICAS_OPTION = "wait_replicas"
TIMEOUT_OPTION = "wait_timeout"


@dataclass(frozen=True, slots=True)
class ReplicaAck:
    """A member's ask: ``replicas`` must acknowledge a write within ``timeout`` seconds."""

    replicas: int
    timeout: float
    #: ``WAIT replicas ms``, packed once (whole milliseconds, at least 1: ``WAIT n 0`` would
    #: block for ever).
    command: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        ms = max(1, math.ceil(self.timeout * 1000))
        wait = hiredis.pack_command(("WAIT", self.replicas, ms))  # type: ignore[arg-type]
        object.__setattr__(self, "command", wait)

    def check_fits(self, node_timeout: float, label: str) -> None:
        """``ValueError`` naming the value unless a reply can come within the node budget."""
        if not self.timeout < node_timeout:
            raise ValueError(
                f"node {label!r}: {TIMEOUT_OPTION}={self.timeout!r} does not fit in the per-node "
                f"budget node_timeout={node_timeout!r}: a member whose replicas are down would "
                f"answer after its budget (use a {TIMEOUT_OPTION} well under it, half or less)"
            )

    def cannot_vote(self, replication: Mapping[str, Any]) -> str | None:
        """Why a member whose ``INFO replication`` (parsed, as redis-py does) is ``replication``
        cannot vote now: fewer replicas acknowledge its writes than its grants wait for, so each
        fails (``REASON``). A replica counts if it is connected, online, and acknowledged within
        ``ACK_LAG`` (a paused or cut-off one stays connected until the primary's timeout, but
        its acknowledgements stop). None if enough do (or INFO does not say)."""
        if not isinstance(replication.get("connected_slaves"), int):
            return None
        acking = sum(
            1
            for name, replica in replication.items()
            if name.startswith("slave") and name[5:].isdigit() and isinstance(replica, dict)
            and replica.get("state") == "online" and int(replica.get("lag", 0)) <= ACK_LAG
        )  # fmt: skip
        if acking >= self.replicas:
            return None
        return (
            f"its grants wait for {self.replicas} replica acknowledgement"
            f"{'s' if self.replicas > 1 else ''} ({REPLICAS_OPTION}={self.replicas}) and "
            f"{acking} replica{'' if acking == 1 else 's'} acknowledge: every grant fails"
        )

    def judge(self, answer: object, acknowledged: object, label: str) -> object:
        """The request's ``answer``, if ``acknowledged`` (what ``WAIT`` said) is enough; else a
        failed vote. An error of the request, or a broken pipe, stays what it is (a script the
        member forgot is asked again, with its ``WAIT``); an error of ``WAIT`` (an ACL without
        ``+wait``, a replica) becomes the answer: a failed vote that says why."""
        if isinstance(answer, Exception | Broken):
            return answer
        if not isinstance(acknowledged, int):
            return acknowledged  # (the pipe broke before it came, or WAIT was refused)
        if acknowledged >= self.replicas:
            return answer
        return NodeFailure(
            label,
            REASON,
            f"{acknowledged}/{self.replicas} replicas acknowledged within {self.timeout} s",
        )


class Acks:
    """A member's replica acknowledgement in this process: what it asks (``ask``), and until
    when (monotonic) it sits out grants after one its replicas did not acknowledge."""

    def __init__(self, ask: ReplicaAck, node_timeout: float, label: str) -> None:
        ask.check_fits(node_timeout, label)
        self.ask = ask
        self.label = label
        self.until = 0.0

    def missed(self) -> None:
        self.until = time.monotonic() + SIT_OUT

    def send(self, pipe: Pipe, request: bytes, now: float, preamble: bytes = b"") -> Slot | None:
        """Write ``request`` and ``WAIT`` behind it in one write; the slot answers for both
        (``preamble``: see ``Pipe.send``)."""
        slot = Acked(now, self.ask, self.label, self.missed)
        return pipe.send(request + self.ask.command, now, (slot.first, slot), preamble=preamble)

    def sitting_out(
        self, command: tuple[Any, ...], script: Script | None, now: float
    ) -> NodeFailure | None:
        """For a grant while the member sits out (see ``SIT_OUT``): its failed vote, not asked;
        else None (ask it)."""
        if self.until <= now or not wanted(command, script):
            return None
        return NodeFailure(
            self.label,
            REASON,
            f"not asked: its replicas did not acknowledge a grant within {self.ask.timeout} s, "
            f"{SIT_OUT - (self.until - now):.2f} s ago; asked again in {self.until - now:.2f} s",
        )


def wanted(command: tuple[Any, ...], script: Script | None) -> bool:
    """Whether a round's request writes what a vote counts on: a script marked ``acked``, or an
    acquisition's ``SET``."""
    return script.acked if script is not None else command[0] == "SET"


class Acked(Slot):
    """The slot of a request followed by ``WAIT``: queued behind ``first``, which takes the
    request's own reply; its own reply is ``WAIT``'s, and what it holds once that came is the
    two judged together (``ReplicaAck.judge``). Rounds see only this one. Given up on by a round
    (it returned at quorum, or its budget ran out), it still takes its replies when they come
    (``keeps_late``): a missing acknowledgement seen late still makes the member sit out grants
    (``missed``, see ``SIT_OUT``)."""

    __slots__ = ("_reply", "ack", "first", "label", "missed")
    keeps_late = True

    def __init__(self, now: float, ack: ReplicaAck, label: str, missed: Callable[[], None]) -> None:
        self.ack = ack
        self.label = label
        self.missed = missed
        self.first = _First(now, self)
        self.sent_at = now
        self.reply = PENDING

    @property
    def reply(self) -> object:
        return self._reply

    @reply.setter
    def reply(self, value: object) -> None:
        if value is not PENDING:
            value = self.ack.judge(self.first.reply, value, self.label)
            if isinstance(value, NodeFailure):
                self.missed()
        self._reply = value


class _First(Slot):
    """Where the request's own reply goes. Given up on with its pair: a pipe whose oldest slot
    is one given up on owes replies (its master is silent), whichever of the two is oldest."""

    __slots__ = ("pair",)
    keeps_late = True

    def __init__(self, now: float, pair: Acked) -> None:
        self.pair = pair
        self.sent_at = now

    @property
    def abandoned(self) -> bool:
        return self.pair.abandoned

    @abandoned.setter
    def abandoned(self, value: bool) -> None:
        pass  # (given up on only with its pair)


def parse(url: str, masked: str) -> tuple[str, ReplicaAck | None]:
    """``url`` without our options (redis-py would pass them to its connections), and the
    acknowledgement they ask for; ``ValueError`` naming ``masked`` (the URL, password masked)
    and the bad value."""
    base, sep, query = url.partition("?")
    if REPLICAS_OPTION not in query and TIMEOUT_OPTION not in query:
        return url, None
    kept, ours = [], {}
    for part in query.split("&"):
        name, _, value = part.partition("=")
        if name in (REPLICAS_OPTION, TIMEOUT_OPTION):
            ours[name] = value
        elif part:
            kept.append(part)
    rest = base + (sep + "&".join(kept) if kept else "")
    if not ours:
        return url, None
    replicas, timeout = ours.get(REPLICAS_OPTION), ours.get(TIMEOUT_OPTION)
    if replicas is None or timeout is None:
        missing = TIMEOUT_OPTION if timeout is None else REPLICAS_OPTION
        raise ValueError(
            f"node {masked!r}: {REPLICAS_OPTION} and {TIMEOUT_OPTION} go together ({missing} "
            f"is missing)"
        )
    if not replicas.isdigit() or int(replicas) < 1:
        raise ValueError(
            f"node {masked!r}: {REPLICAS_OPTION} must be a whole number of replicas, 1 or more, "
            f"got {replicas!r}"
        )
    try:
        seconds = float(timeout)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0.001:
        raise ValueError(
            f"node {masked!r}: {TIMEOUT_OPTION} must be seconds, at least 0.001 (WAIT counts "
            f"whole milliseconds; 0 would wait for ever), got {timeout!r}"
        )
    return rest, ReplicaAck(int(replicas), seconds)
