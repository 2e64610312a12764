"""Which locks are held right now, read from every master; and the admin's force release.

Listing: each master is SCANned (never KEYS) with MATCH on the glob-escaped key prefix, the
resource names are merged across masters and sorted, and only the requested page is read back:
one pipeline per master with each key's value, PTTL and fencing counter. Masters are asked at
once, in threads. A master that cannot be read is reported, and the k of "held on k of N" is then
a lower bound.

Reading is a snapshot, not atomic across masters: a lock being acquired or released while we read
may show on fewer masters than it will a moment later.

Tokens never leave this module: a copy is shown by the fingerprint of its token (a short sha256).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import redis

from .engine import NodeFailure, Redlock, protocol
from .engine.connections import Node
from .engine.drivers import fan_out
from .engine.rounds import failure
from .engine.scripts import RELEASE
from .health import admin_client

T = TypeVar("T")

#: Seconds to wait for each answer while listing or releasing (an admin action, not a lock
#: request: a busy master should be read, not skipped).
INVENTORY_TIMEOUT = 1.0
#: Keys asked per SCAN call: large enough that a big keyspace takes few round trips.
SCAN_COUNT = 1000
#: Longest search string accepted (it becomes part of a MATCH pattern).
MAX_SEARCH = 200
MAX_PAGE_SIZE = 1000
FINGERPRINT_LENGTH = 8
_FINGERPRINT = re.compile(rf"[0-9a-f]{{{FINGERPRINT_LENGTH}}}")
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")


def glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern (escapes ``* ? [ ] \\``)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


def fingerprint(token: str | bytes) -> str:
    """A short, safe-to-show name for a token: the first hex digits of its sha256."""
    data = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(data).hexdigest()[:FINGERPRINT_LENGTH]


@dataclass(frozen=True)
class Owner:
    """Who took a lock, as its holder wrote it next to the token (for humans, not for safety)."""

    host: str | None = None
    pid: int | None = None
    thread: str | None = None
    label: str | None = None
    since: float | None = None  # unix wall-clock seconds at acquisition
    ttl: float | None = None  # the lease the holder asked for, seconds

    @classmethod
    def parse(cls, text: str) -> Owner:
        try:
            data = json.loads(text)
        except ValueError:
            return cls()
        if not isinstance(data, dict):
            return cls()
        return cls(
            host=_typed(data.get("host"), str),
            pid=_typed(data.get("pid"), int),
            thread=_typed(data.get("thread"), str),
            label=_typed(data.get("label"), str),
            since=_number(data.get("since")),
            ttl=_number(data.get("ttl")),
        )

    def __str__(self) -> str:
        parts = [self.host or "?", f"pid {self.pid if self.pid is not None else '?'}"]
        if self.thread:
            parts.append(f"thread {self.thread}")
        if self.label:
            parts.append(f"label {self.label!r}")
        return " ".join(parts)


def _typed(value: object, kind: type[T]) -> T | None:
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def split_value(value: bytes) -> tuple[str, Owner]:
    """``<token>:<json owner>`` -> (fingerprint of the token, owner). A value in another shape
    (not written by us) is fingerprinted whole."""
    token, sep, rest = value.partition(b":")
    if not sep:
        return fingerprint(value), Owner()
    return fingerprint(token), Owner.parse(rest.decode("utf-8", "replace"))


@dataclass(frozen=True)
class Copy:
    """One master's copy of a lock key."""

    node: str
    fingerprint: str
    ttl: float | None  # seconds left on this master; None: the key has no expiry (not ours)
    owner: Owner


@dataclass(frozen=True)
class HeldLock:
    """One resource across all masters. The holder is the token found on the most masters;
    copies with other tokens, or all copies when the holder is below quorum, are stale."""

    resource: str
    node_count: int
    quorum: int
    fingerprint: str
    owner: Owner
    held_on: int
    min_ttl: float | None
    max_ttl: float | None
    validity: float  # estimate: seconds until fewer than a quorum of the holder's copies remain
    fence: int | None
    stale: tuple[Copy, ...]
    copies: tuple[Copy, ...]

    @property
    def has_quorum(self) -> bool:
        return self.held_on >= self.quorum

    @property
    def acquired_at(self) -> float | None:
        return self.owner.since


def summarize(
    resource: str,
    copies: Sequence[Copy],
    *,
    node_count: int,
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
    stale = tuple(c for c in copies if c.fingerprint != holder or len(mine) < quorum)
    return HeldLock(
        resource=resource,
        node_count=node_count,
        quorum=quorum,
        fingerprint=holder,
        owner=owner,
        held_on=len(mine),
        min_ttl=min(ttls) if ttls else None,
        max_ttl=max(ttls) if ttls else None,
        validity=validity,
        fence=fence,
        stale=stale,
        copies=tuple(copies),
    )


def _ttl_order(ttl: float | None) -> float:
    return math.inf if ttl is None else ttl


@dataclass(frozen=True)
class Inventory:
    """One page of held locks, sorted by resource."""

    locks: tuple[HeldLock, ...]
    total: int  # resources matching the search on any master
    page: int
    page_size: int
    search: str
    failures: tuple[NodeFailure, ...]  # masters that could not be read

    @property
    def pages(self) -> int:
        return max(1, math.ceil(self.total / self.page_size))

    @property
    def has_next(self) -> bool:
        return self.page < self.pages

    @property
    def has_previous(self) -> bool:
        return self.page > 1


def list_locks(
    redlock: Redlock,
    *,
    search: str = "",
    page: int = 1,
    page_size: int = 50,
    timeout: float = INVENTORY_TIMEOUT,
) -> Inventory:
    """Page ``page`` (from 1; past the end gives the last) of the locks whose resource contains
    ``search``, with ``page_size`` resources per page."""
    if not isinstance(search, str) or len(search) > MAX_SEARCH:
        raise ValueError(f"search must be a str of at most {MAX_SEARCH} characters, got {search!r}")
    if isinstance(page, bool) or not isinstance(page, int) or page < 1:
        raise ValueError(f"page must be an int >= 1, got {page!r}")
    if (
        isinstance(page_size, bool)
        or not isinstance(page_size, int)
        or not 1 <= page_size <= MAX_PAGE_SIZE
    ):
        raise ValueError(f"page_size must be an int from 1 to {MAX_PAGE_SIZE}, got {page_size!r}")
    prefix = redlock.lock_key("")
    pattern = glob_escape(prefix) + "*" + (glob_escape(search) + "*" if search else "")
    scanned = _each_node(redlock, lambda client: _scan(client, pattern, prefix), timeout)
    names: set[str] = set()
    failures = []
    for result in scanned:
        if isinstance(result, NodeFailure):
            failures.append(result)
        else:
            names |= result
    ordered = sorted(names)
    pages = max(1, math.ceil(len(ordered) / page_size))
    page = min(page, pages)
    chunk = ordered[(page - 1) * page_size : page * page_size]
    locks, read_failures = _read(redlock, chunk, timeout)
    failures += [f for f in read_failures if f.node not in {g.node for g in failures}]
    return Inventory(tuple(locks), len(ordered), page, page_size, search, tuple(failures))


def inspect(
    redlock: Redlock, resource: str, *, timeout: float = INVENTORY_TIMEOUT
) -> HeldLock | None:
    """``resource``'s copies on every master now, or None if no master has one."""
    protocol.check_resource(resource)
    locks, _ = _read(redlock, [resource], timeout)
    return locks[0] if locks else None


def _each_node(
    redlock: Redlock, ask: Callable[[redis.Redis], T], timeout: float
) -> list[T | NodeFailure]:
    """``ask(client)`` on every master at once; a master that fails gives its NodeFailure."""

    def one(node: Node) -> T | NodeFailure:
        client = admin_client(node, timeout)
        try:
            return ask(client)
        except (redis.RedisError, OSError) as exc:
            return failure(node, exc)
        finally:
            client.close()

    with ThreadPoolExecutor(len(redlock.nodes), thread_name_prefix="redlock-inventory") as pool:
        return list(pool.map(one, redlock.nodes))


def _scan(client: redis.Redis, pattern: str, prefix: str) -> set[str]:
    skip = len(prefix.encode())
    return {
        key[skip:].decode("utf-8", "replace")
        for key in client.scan_iter(match=pattern, count=SCAN_COUNT)
    }


def _read(
    redlock: Redlock, resources: Sequence[str], timeout: float
) -> tuple[list[HeldLock], list[NodeFailure]]:
    if not resources:
        return [], []

    def ask(client: redis.Redis) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for resource in resources:
            pipe.get(redlock.lock_key(resource))
            pipe.pttl(redlock.lock_key(resource))
            pipe.get(redlock.fence_key(resource))
        return pipe.execute()

    replies = _each_node(redlock, ask, timeout)
    failures = [r for r in replies if isinstance(r, NodeFailure)]
    locks = []
    for i, resource in enumerate(resources):
        copies: list[Copy] = []
        fences: list[int] = []
        for node, reply in zip(redlock.nodes, replies, strict=True):
            if isinstance(reply, NodeFailure):
                continue
            value, pttl, fence = reply[3 * i : 3 * i + 3]
            if fence is not None and fence.isdigit():
                fences.append(int(fence))
            if value is None:  # expired or released since the scan
                continue
            fp, owner = split_value(value)
            ttl = None if pttl == -1 else max(pttl, 0) / 1000  # -1: no expiry, -2: just gone
            copies.append(Copy(node.label, fp, ttl, owner))
        if copies:
            locks.append(
                summarize(
                    resource,
                    copies,
                    node_count=len(redlock.nodes),
                    fence=max(fences) if fences else None,
                    drift_factor=redlock.drift_factor,
                )
            )
    return locks, failures


# --- force release ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseOutcome:
    node: str
    released: bool
    detail: str  # "released", "not held by this holder", or why the master failed


@dataclass(frozen=True)
class ForceRelease:
    """What a force release did. ``owner`` is None when no master held that fingerprint: then
    nothing was sent."""

    resource: str
    fingerprint: str
    owner: Owner | None
    outcomes: tuple[ReleaseOutcome, ...]

    @property
    def released_on(self) -> int:
        return sum(o.released for o in self.outcomes)

    def describe(self) -> str:
        """One line for humans and the admin log (no token in it)."""
        head = f"force release of {self.resource!r} holder {self.fingerprint}"
        if self.owner is None:
            return f"{head}: not held by that holder on any master, nothing released"
        per_node = "; ".join(f"{o.node}: {o.detail}" for o in self.outcomes)
        return (
            f"{head} ({self.owner}): released on {self.released_on} of "
            f"{len(self.outcomes)} masters [{per_node}]"
        )


def check_fingerprint(value: object) -> str:
    if not isinstance(value, str) or not _FINGERPRINT.fullmatch(value):
        raise ValueError(
            f"fingerprint must be {FINGERPRINT_LENGTH} lowercase hex digits, got {value!r}"
        )
    return value


def force_release(
    redlock: Redlock, resource: str, fingerprint_: str, *, timeout: float = INVENTORY_TIMEOUT
) -> ForceRelease:
    """Delete the copies of ``resource`` held by the holder with this token fingerprint, and only
    those: the current values are re-read, and the exact value whose token matches is removed
    with the engine's compare-and-delete script on every master. A new holder that took the lock
    since the fingerprint was shown keeps it."""
    protocol.check_resource(resource)
    check_fingerprint(fingerprint_)
    key = redlock.lock_key(resource)
    nodes = redlock.nodes
    current = fan_out(nodes, ("GET", key), timeout)
    values: list[bytes] = []
    owner = None
    for reply in current:
        if isinstance(reply, bytes) and reply not in values:
            fp, found_owner = split_value(reply)
            if fp == fingerprint_:
                values.append(reply)
                owner = found_owner
    released = [False] * len(nodes)
    details = ["not held by this holder"] * len(nodes)
    for i, reply in enumerate(current):
        if isinstance(reply, NodeFailure):
            details[i] = f"{reply.reason}: {reply.detail}"
    for value in values:  # one, unless a foreign writer reused the token with another owner
        command = redlock.release_command(resource, value)
        replies = fan_out(nodes, command, timeout, RELEASE)
        for i, reply in enumerate(replies):
            if isinstance(reply, int) and reply >= 1:  # 1 + waiters woken; 0: not this holder
                released[i] = True
                details[i] = "released"
            elif isinstance(reply, NodeFailure) and not released[i]:
                details[i] = f"{reply.reason}: {reply.detail}"
    outcomes = tuple(
        ReleaseOutcome(node.label, released[i], details[i]) for i, node in enumerate(nodes)
    )
    return ForceRelease(resource, fingerprint_, owner, outcomes)
