"""Which locks are held right now, read from every master (the admin's page, ``redlock_status``).

Listing: each master is SCANned (never KEYS) with MATCH on the glob-escaped key prefix, the
resource names are merged across masters and sorted, and only the requested page is read back:
one pipeline per master with each key's type, PTTL, length, value (at most
``engine.values.MAX_VALUE_BYTES`` of it) and fencing counter. Masters are asked at once, in threads.
A master that cannot be read is reported, and the k of "held on k of N" is then a lower bound.

Whatever is under the prefix is read without trusting it: a key of another type, a value that is
not ours, too long, or nested too deep becomes an ``UnreadableKey`` (with its type and size) on
that master, never an exception, and the master's other keys are still listed.

Reading is a snapshot, not atomic across masters: a lock being acquired or released while we read
may show on fewer masters than it will a moment later.

Tokens never leave this module: a copy is shown by the fingerprint of its token (a short sha256).
What the copies of one lock say together is ``held``'s; the force release is ``force_release``'s.

Semaphores and readers (``limit=N``, ``shared=True``): each permit (the slot key
``slot:<name>#<i>``, shown as ``<name>#<i>``) and each reader (``<name>@reader:<id>``) is a holder
row of its own, marked with its group; the name's own key holds a marker (``semaphore:<N>`` or
``readers``), which is no holder: it becomes the group's summary (``Inventory.groups``: permits in
use out of N, readers). A plain lock may have a permit's shown name: another key, another row
(``HeldLock.slot`` tells a permit), released by name and slot (``force_release``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import redis

from ..engine import NodeFailure, Redlock
from ..engine.algorithm.markers import is_marker, limit_of
from ..engine.base import protocol
from ..engine.base.values import MAX_VALUE_BYTES, UnreadableValue, parse_value
from ..engine.kinds.modes import reader_of
from ..engine.members.connections import Node
from ..engine.members.rounds import failure
from ..engine.scripts.permits import MAX_LIMIT, SLOT_KIND, slot_prefix
from .health import admin_client
from .held import HELD, Copy, HeldLock, UnreadableKey, summarize

__all__ = ["Inventory", "glob_escape", "inspect", "list_locks"]

T = TypeVar("T")

#: Seconds to wait for each answer while listing or releasing (an admin action, not a lock
#: request: a busy master should be read, not skipped).
INVENTORY_TIMEOUT = 1.0
#: Keys asked per SCAN call: large enough that a big keyspace takes few round trips.
SCAN_COUNT = 1000
#: Longest search string accepted (it becomes part of a MATCH pattern).
MAX_SEARCH = 200
MAX_PAGE_SIZE = 1000
_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")
#: How to count the elements of a key of another type than string (to say how big it is).
_LENGTH_COMMAND = {
    "hash": "HLEN",
    "list": "LLEN",
    "set": "SCARD",
    "zset": "ZCARD",
    "stream": "XLEN",
}
#: Longer values are no mode's marker ("semaphore:10000" is the longest).
MARKER_BYTES = 16
#: Longest fencing counter we read as a number (a signed 64-bit integer has 19 digits).
_MAX_FENCE_DIGITS = 20


def glob_escape(text: str) -> str:
    """``text`` as a literal in a Redis MATCH pattern (escapes ``* ? [ ] \\``)."""
    return _GLOB_SPECIAL.sub(r"\\\1", text)


@dataclass(frozen=True)
class Group:
    """A semaphore or a readers/writer lock seen on this page: its name, "permits" or "readers",
    the limit, and how many of its holders hold on a quorum (permits in use, readers)."""

    name: str
    mode: str
    limit: int | None
    in_use: int

    def describe(self) -> str:
        if self.mode == "permits":
            return f"{self.name}: {self.in_use} of {self.limit} permits in use"
        return f"{self.name}: {self.in_use} reader{'' if self.in_use == 1 else 's'}"


@dataclass(frozen=True)
class Inventory:
    """One page of held locks, sorted by resource."""

    locks: tuple[HeldLock, ...]
    total: int  # resources matching the search on any master
    page: int
    page_size: int
    search: str
    failures: tuple[NodeFailure, ...]  # masters that could not be read
    unreadable: tuple[UnreadableKey, ...] = ()  # keys of this page that are not lock values
    groups: tuple[Group, ...] = ()  # semaphores and readers/writer locks on this page

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
    prefix = redlock.key_prefix
    # One SCAN for both kinds of key a holder has (a lock's, a permit's): MATCH filters only
    # what is sent back, every key is visited either way; the other kinds are dropped here.
    pattern = glob_escape(prefix) + "*" + (glob_escape(search) + "*" if search else "")
    scanned = _each_node(redlock, lambda client: _scan(client, pattern, prefix, search), timeout)
    names: set[Listed] = set()
    failures = []
    for result in scanned:
        if isinstance(result, NodeFailure):
            failures.append(result)
        else:
            names |= result
    ordered = sorted(names, key=lambda listed: (listed.name, listed.kind))
    pages = max(1, math.ceil(len(ordered) / page_size))
    page = min(page, pages)
    chunk = ordered[(page - 1) * page_size : page * page_size]
    locks, unreadable, read_failures, markers = _read(redlock, chunk, timeout)
    failures += [f for f in read_failures if f.node not in {g.node for g in failures}]
    return Inventory(
        _one_row_per_holder(locks),
        len(ordered),
        page,
        page_size,
        search,
        tuple(failures),
        tuple(unreadable),
        _groups(locks, markers),
    )


def _groups(locks: Sequence[HeldLock], markers: dict[str, str]) -> tuple[Group, ...]:
    """The semaphores and readers/writer locks whose marker or members are on this page."""
    found: dict[str, Group] = {}
    for name, marker in markers.items():
        limit = limit_of(marker)
        found[name] = Group(name, "readers" if limit is None else "permits", limit, 0)
    for lock in locks:
        if lock.mode == "lock":
            continue
        group = found.get(lock.group) or Group(
            lock.group, "permits" if lock.mode == "permit" else "readers", lock.limit, 0
        )
        found[lock.group] = replace(group, in_use=group.in_use + (lock.state == HELD))
    return tuple(found[name] for name in sorted(found))


def _one_row_per_holder(locks: Sequence[HeldLock]) -> tuple[HeldLock, ...]:
    """A lock over several resources is one holder: one row naming all its resources (those on
    this page), where it holds each of them. A fingerprint is of a random token: the same one on
    two resources is the same acquisition."""
    by_holder: dict[str, list[HeldLock]] = {}
    for lock in locks:
        if lock.state == HELD:
            by_holder.setdefault(lock.fingerprint, []).append(lock)
    rows = []
    for lock in locks:
        together = by_holder.get(lock.fingerprint, [lock]) if lock.state == HELD else [lock]
        if len(together) == 1:
            rows.append(lock)
        elif together[0] is lock:
            rows.append(replace(lock, resources=tuple(t.resource for t in together)))
    return tuple(rows)


def inspect(
    redlock: Redlock,
    resource: str,
    *,
    slot: int | None = None,
    timeout: float = INVENTORY_TIMEOUT,
) -> HeldLock | None:
    """``resource``'s copies on every master now (or those of permit ``slot`` of the semaphore
    ``resource``), or None if no master has one."""
    protocol.check_resource(resource)
    spelled = redlock.spelled(resource)  # as its keys spell it (hash-tagged on a Cluster)
    if slot is None:
        listed = Listed(LOCK, spelled)
    else:
        listed = Listed(SLOT, f"{spelled}#{check_slot(slot)}")
    locks, _, _, _ = _read(redlock, [listed], timeout)
    return locks[0] if locks else None


#: The kinds of key that are a holder's (after the key prefix): a lock's (``lock:<name>``, a
#: reader's too) and a semaphore's permit's (``slot:<name>#<i>``: ``permit_scripts.slot_prefix``).
LOCK = "lock"
SLOT = SLOT_KIND


@dataclass(frozen=True, order=True)
class Listed:
    """A holder's key found by the scan: its kind and the name after it (a permit's is
    ``<semaphore>#<slot>``, as it is shown)."""

    kind: str
    name: str

    @property
    def slot(self) -> tuple[str, int] | None:
        """A permit's semaphore and slot; None for a lock's key."""
        group, _, slot = self.name.rpartition("#")
        return (group, int(slot)) if self.kind == SLOT else None


def check_slot(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_LIMIT:
        raise ValueError(f"slot must be an int from 0 to {MAX_LIMIT - 1}, got {value!r}")
    return value


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


def _scan(client: redis.Redis, pattern: str, prefix: str, search: str) -> set[Listed]:
    """The holders' keys after ``prefix`` whose name contains ``search``; bytes that are not
    UTF-8 are kept (as surrogates) so that the key can be read back exactly and shown as
    unreadable. A permit's key whose name does not end in ``#<slot>`` is none of ours."""
    skip = len(prefix.encode())
    found = set()
    for key in client.scan_iter(match=pattern, count=SCAN_COUNT):
        kind, colon, name = key[skip:].decode("utf-8", "surrogateescape").partition(":")
        if not colon or kind not in (LOCK, SLOT) or search not in name:
            continue
        if kind == SLOT and not _SLOT_NAME.fullmatch(name):
            continue
        found.add(Listed(kind, name))
    return found


_SLOT_NAME = re.compile(r".+#(0|[1-9][0-9]{0,3})", re.DOTALL)  # as slot_prefix writes them


def _raw_key(prefix: str, listed: Listed) -> bytes:
    permit = listed.slot
    if permit is not None:  # (made where every slot key is)
        key = f"{slot_prefix(prefix, permit[0])}{permit[1]}"
    else:
        key = f"{prefix}{listed.kind}:{listed.name}"
    return key.encode("utf-8", "surrogateescape")


def _read(
    redlock: Redlock, listed: Sequence[Listed], timeout: float
) -> tuple[list[HeldLock], list[UnreadableKey], list[NodeFailure], dict[str, str]]:
    """Every master's copy of each listed key, grouped into held locks and unreadable keys; and
    the markers of semaphores and readers/writer locks, by name. A permit's fencing counter is
    its semaphore's (one sequence per semaphore)."""
    if not listed:
        return [], [], [], {}
    prefix = redlock.key_prefix
    keys = [(_raw_key(prefix, each), _raw_key(prefix, _fence_of(each))) for each in listed]
    replies = _each_node(redlock, lambda client: _ask_keys(client, keys), timeout)
    failures = [r for r in replies if isinstance(r, NodeFailure)]
    held: list[tuple[HeldLock, Listed]] = []
    unreadable: list[UnreadableKey] = []
    markers: dict[str, str] = {}
    for i, each in enumerate(listed):
        copies: list[Copy] = []
        fences: list[int] = []
        for node, reply in zip(redlock.nodes, replies, strict=True):
            if isinstance(reply, NodeFailure):
                continue
            found, fence = _copy(node.label, each.name, reply[i])
            if fence is not None:
                fences.append(fence)
            if isinstance(found, str):
                if each.kind == LOCK:  # (a marker where a permit should be: none of ours)
                    markers[each.name] = found
            elif isinstance(found, UnreadableKey):
                unreadable.append(found)
            elif found is not None:
                copies.append(found)
        if copies:
            lock = summarize(
                each.name,
                copies,
                node_count=len(redlock.nodes),
                unread=len(failures),
                fence=max(fences) if fences else None,
                drift_factor=redlock.drift_factor,
            )
            held.append((lock, each))
    groups = {permit[0] for _, each in held if (permit := each.slot) is not None}
    if groups - set(markers):  # semaphores whose permits are on this page but not their markers
        markers.update(_markers(redlock, sorted(groups - set(markers)), timeout))
    return [_of_group(lock, each, markers) for lock, each in held], unreadable, failures, markers


def _of_group(lock: HeldLock, listed: Listed, markers: dict[str, str]) -> HeldLock:
    """``lock`` marked as a permit of its semaphore, or a reader of its readers/writer lock."""
    permit = listed.slot
    if permit is not None:
        group, slot = permit
        limit = limit_of(markers.get(group, ""))
        return replace(lock, mode="permit", group=group, limit=limit, slot=slot)
    reader = reader_of(lock.resource)
    return lock if reader is None else replace(lock, mode="reader", group=reader)


def _fence_of(listed: Listed) -> Listed:
    """The fencing counter's key to read beside a holder's key."""
    permit = listed.slot
    return Listed("fence", listed.name if permit is None else permit[0])


def _markers(redlock: Redlock, names: Sequence[str], timeout: float) -> dict[str, str]:
    """The markers (``markers``) under these names' lock keys, as the masters that have one
    say."""
    keys = [redlock.lock_key(name) for name in names]

    def ask(client: redis.Redis) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.get(key)  # (GET, not MGET: what the ACL's monitor user is granted)
        return pipe.execute(raise_on_error=False)

    found: dict[str, str] = {}
    for reply in _each_node(redlock, ask, timeout):
        if isinstance(reply, NodeFailure):
            continue
        for name, value in zip(names, reply, strict=True):
            if isinstance(value, bytes) and len(value) < MARKER_BYTES:
                text = value.decode("ascii", "replace")
                if is_marker(text):
                    found.setdefault(name, text)
    return found


def _ask_keys(client: redis.Redis, keys: Sequence[tuple[bytes, bytes]]) -> list[list[Any]]:
    """For each (lock key, fence key): [type, pttl, strlen, value head, fence, length]. An answer
    the master refused (a wrong type, an ACL) is the exception itself, not raised: it belongs to
    that key only. ``length`` (elements) is asked only for keys that are not strings."""
    pipe = client.pipeline(transaction=False)
    for key, fence_key in keys:
        pipe.type(key)
        pipe.pttl(key)
        pipe.strlen(key)
        pipe.getrange(key, 0, MAX_VALUE_BYTES)  # one byte more than a value may have: no more
        pipe.get(fence_key)
    flat = pipe.execute(raise_on_error=False)
    answers = [[*flat[5 * i : 5 * i + 5], None] for i in range(len(keys))]
    others = [i for i, answer in enumerate(answers) if _text(answer[0]) in _LENGTH_COMMAND]
    if others:  # rare: only when something else than a lock sits under the prefix
        pipe = client.pipeline(transaction=False)
        for i in others:
            pipe.execute_command(_LENGTH_COMMAND[_text(answers[i][0])], keys[i][0])
        for i, length in zip(others, pipe.execute(raise_on_error=False), strict=True):
            answers[i][5] = length
    return answers


def _copy(
    node: str, resource: str, answer: list[Any]
) -> tuple[Copy | UnreadableKey | str | None, int | None]:
    """One master's answers about one resource -> its copy (None: gone since the scan) or why it
    cannot be read, and the fencing counter if there is a readable one."""
    kind_reply, pttl, strlen, value, fence_reply, length = answer
    fence = None
    if isinstance(fence_reply, bytes) and fence_reply.isdigit():
        fence = int(fence_reply) if len(fence_reply) <= _MAX_FENCE_DIGITS else None
    kind = _text(kind_reply)
    size = strlen if isinstance(strlen, int) else None
    if kind == "none" or (kind == "unknown" and size == 0):
        return None, fence  # expired or released since the scan

    def unreadable(reason: str, size: int | None = size) -> UnreadableKey:
        return UnreadableKey(node, resource, kind, size, reason)

    if kind not in ("string", "unknown"):
        elements = length if isinstance(length, int) else None
        return unreadable(f"a Redis {kind}, not a lock value", elements), fence
    if not isinstance(value, bytes):
        return unreadable(f"could not read it: {value}"), fence
    if not _is_text(resource):
        return unreadable("its name is not UTF-8 text"), fence
    if len(value) < MARKER_BYTES and is_marker(value.decode("ascii", "replace")):
        return value.decode("ascii"), fence
    try:
        fp, owner = parse_value(value, size=size)
    except UnreadableValue as exc:
        return unreadable(str(exc)), fence
    ttl = None if pttl == -1 or not isinstance(pttl, int) else max(pttl, 0) / 1000
    return Copy(node, fp, ttl, owner), fence  # pttl -1: no expiry; -2: gone just now


def _text(reply: object) -> str:
    if isinstance(reply, bytes):
        return reply.decode("ascii", "replace")
    return reply if isinstance(reply, str) else "unknown"


def _is_text(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
