"""Restart and failover quarantine: the Redis documentation's "delayed restarts" rule, done in the
client. A member that may have lost keys it granted (it restarted empty, or a replica that never
received them was promoted) must not vote until every lease it may have granted before has run
out: at most ``MAX_TTL`` seconds, the longest TTL any lock may have.

How a member's identity is known: ``INFO server`` (``run_id``, ``uptime_in_seconds``) and
``INFO replication`` (``role``, ``master_replid``), read on every new connection to it, never on
a round's path. A restart or a failover always breaks our connections, so the new connection
that follows is where the change is seen. The rule: a vote counts only from a member whose
identity is unchanged for at least ``MAX_TTL``:

- first sight: it abstains until its uptime reaches ``MAX_TTL`` (a freshly started process has
  nothing it granted before, but we cannot tell a fresh start from a crash we did not watch); a
  Cluster shard promoted from a replica since it started (``second_repl_offset`` set) abstains
  ``MAX_TTL`` (a failover inside a cluster shows us a new address, so a first sight);
- a changed ``run_id`` (restarted) or ``master_replid`` (failed over), or a member that is not a
  primary: it abstains for ``MAX_TTL`` from when we saw it.

An abstaining member still receives every request (its keys are written and deleted as on any
member, so a release cleans it too); only its answers do not count: ``rounds`` turns each into a
failed vote with reason ``"quarantine"``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import ResponseError

from ..base.errors import NodeFailure

#: The ``NodeFailure.reason`` of an abstaining member's answer.
REASON = "quarantine"

#: The two sections, asked for one after the other on one connection (one round trip): Redis 7
#: takes several sections in one INFO, but 6.2 answers that with a syntax error.
INFO_REQUESTS = (("INFO", "server"), ("INFO", "replication"))


@dataclass(frozen=True, slots=True)
class Identity:
    """Which server process, in which replication history, a member is, and for how long."""

    run_id: str
    replid: str
    role: str
    uptime: float  # seconds (INFO gives whole seconds, rounded down: never over-estimated)
    #: Whether it was promoted from a replica since it started (``second_repl_offset`` is set:
    #: it keeps its former primary's history beside its own).
    promoted: bool = False


def parse_info(raw: bytes | str) -> Identity:
    """An ``Identity`` from the text of ``INFO server replication``; ``ValueError`` if a field is
    missing (an ACL that refuses INFO answers an error, never a partial text)."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    fields = dict(
        line.split(":", 1) for line in text.splitlines() if ":" in line and not line.startswith("#")
    )
    try:
        return Identity(
            run_id=fields["run_id"].strip(),
            replid=fields["master_replid"].strip(),
            role=fields["role"].strip(),
            uptime=float(fields["uptime_in_seconds"]),
            promoted=fields.get("second_repl_offset", "-1").strip() != "-1",
        )
    except (KeyError, ValueError) as exc:
        raise ValueError(f"INFO server replication lacks an identity field: {exc}") from None


def parse_run_id(raw: object) -> str | None:
    """``run_id`` from the text of an ``INFO server`` reply; None if it is not one (an error
    reply: an ACL that refuses INFO)."""
    if not isinstance(raw, bytes | str):
        return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    for line in text.splitlines():
        if line.startswith("run_id:"):
            return line.split(":", 1)[1].strip() or None
    return None


def read_identity(conn: Any) -> Identity:
    """The identity of the server behind ``conn`` (an open redis-py connection): one round trip,
    on a connection no round uses yet."""
    for request in INFO_REQUESTS:
        conn.send_command(*request)
    texts, refused = [], None
    for _ in INFO_REQUESTS:  # both replies read, even after an error: none left on the connection
        try:
            reply = conn.read_response()
        except ResponseError as exc:
            refused = refused or exc
            continue
        texts.append(reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply))
    if refused is not None:
        raise refused
    return parse_info("\n".join(texts))


class Watch:
    """One member's quarantine state in this process: the identity last seen, and until when
    (monotonic) it abstains, and why."""

    def __init__(self, max_ttl: float, *, distrust_promotion: bool = False) -> None:
        self.max_ttl = max_ttl
        #: At first sight, a primary promoted since it started abstains (``max_ttl``): a Cluster
        #: shard, whose failover gives the member a new address, hence a first sight rather than
        #: a changed replication id (a plain member keeps its address: its watch sees that).
        self.distrust_promotion = distrust_promotion
        self.identity: Identity | None = None
        #: Monotonic time until which this member's answers count as failed votes (0: none).
        self.until = 0.0
        self.reason = ""
        self._guard = threading.Lock()  # connects of several threads and loops may judge at once

    def judge(self, identity: Identity, now: float | None = None) -> None:
        """Take a freshly read identity: abstain as long as the rule says (never shortening an
        abstention already decided)."""
        now = time.monotonic() if now is None else now
        with self._guard:
            previous, self.identity = self.identity, identity
            until, reason = 0.0, ""
            if identity.role != "master":
                until, reason = now + self.max_ttl, f"not a primary (role {identity.role})"
            elif previous is not None and previous.replid != identity.replid:
                # (A restart without persistence changes both; a failover to another process
                # too; a promoted replica that we saw as a replica only its replication id.)
                new_run = " and run_id" if previous.run_id != identity.run_id else ""
                until = now + self.max_ttl
                reason = f"restarted or failed over (new replication id{new_run})"
            elif previous is not None and previous.run_id != identity.run_id:
                until, reason = now + self.max_ttl, "restarted (new run_id)"
            elif previous is None and self.distrust_promotion and identity.promoted:
                # We cannot tell when: it may have been a moment ago, without our lock keys.
                until = now + self.max_ttl
                reason = "promoted from a replica since it started (a failover we did not see)"
            elif identity.uptime < self.max_ttl:
                until = now + self.max_ttl - identity.uptime
                reason = f"up only {identity.uptime:.0f} s"
            if until > self.until:
                self.until, self.reason = until, reason

    def cannot_tell(self, why: str, now: float | None = None) -> None:
        """A member that would not say who it is: abstains ``max_ttl`` from now, every time."""
        now = time.monotonic() if now is None else now
        with self._guard:
            self.identity = None
            if now + self.max_ttl > self.until:
                self.until, self.reason = now + self.max_ttl, f"identity unreadable ({why})"

    def failure(self, label: str, now: float) -> NodeFailure | None:
        """The failed vote that replaces this member's answer now, if it abstains."""
        if self.until <= now:
            return None
        left = self.until - now
        return NodeFailure(label, REASON, f"{self.reason}; abstains {left:.1f} s more")

    def abstaining(self, now: float | None = None) -> bool:
        return self.until > (time.monotonic() if now is None else now)


class Member(Protocol):
    """What a round knows of a member here (a ``connections.Node``)."""

    label: str
    watch: Watch | None


def abstain(nodes: Sequence[Member], replies: list[Any]) -> None:
    """The answer of a member that abstains now counts as a failed vote, whatever it said (at the
    end of every round). Its request was still sent and applied: a release cleans it as any
    other member; only its grants do not count."""
    now = 0.0
    for i, node in enumerate(nodes):
        watch = node.watch
        if watch is None or not watch.until or isinstance(replies[i], NodeFailure):
            continue
        now = now or time.monotonic()
        abstention = watch.failure(node.label, now)
        if abstention is not None:
            replies[i] = abstention


def abstains(node: Member) -> bool:
    watch = node.watch
    return watch is not None and watch.abstaining()
