"""The Redlock decisions as pure functions: no I/O, no clock, no randomness of their own.

The procedures (``procedures``, ``holding``), run by the sync and the async driver alike, feed what
the masters said into these functions, and property tests can check the algorithm alone.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import os.path
import random
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

#: Longest resource name we accept. Names built from request data must stay bounded; the Django
#: layer hashes longer ones (see ``bounded_resource``).
MAX_RESOURCE_LENGTH = 512

#: Longest ``ttl``, ``wait`` or other duration we accept: one year. Redis takes PX up to a signed
#: 64-bit count of milliseconds from now, but a lease or a wait longer than a year is a bug, not a
#: lock (use ``auto_extend`` for long work); and a bound far below Redis' keeps every deadline we
#: compute an exact float.
MAX_SECONDS = 365 * 24 * 3600.0

#: Longest label: it is stored in every master's copy of the lock value and shown to operators.
MAX_LABEL_LENGTH = 200

#: Fixed part of the drift allowance: covers Redis' own expiry granularity (1 ms) and rounding.
DRIFT_FLOOR = 0.002


class Vote(Enum):
    """What one master answered to one request."""

    GRANTED = "granted"  # did what we asked (SET NX succeeded, our key was extended / deleted)
    DENIED = "held"  # answered, but another owner holds the key (or ours is gone)
    FAILED = "failed"  # no usable answer within the budget: down, paused, slow, error


def quorum(node_count: int) -> int:
    """Majority of ``node_count`` masters: ``N // 2 + 1`` (an integer, never ``N / 2 + 1``)."""
    if node_count < 1:
        raise ValueError(f"need at least one node, got {node_count}")
    return node_count // 2 + 1


def drift(ttl: float, drift_factor: float) -> float:
    """Clock drift allowance: how much sooner than ``ttl`` we stop trusting the lease."""
    return ttl * drift_factor + DRIFT_FLOOR


def validity(ttl: float, elapsed: float, drift_factor: float) -> float:
    """Seconds of guaranteed exclusivity left after a request that took ``elapsed`` seconds."""
    return ttl - elapsed - drift(ttl, drift_factor)


# (Not frozen: a frozen dataclass's __init__ costs three times a plain one's; made every round.)
@dataclass(slots=True)
class Tally:
    """The verdict on one round of requests to all masters."""

    granted: int
    denied: int
    failed: int
    quorum: int
    validity: float

    @property
    def won(self) -> bool:
        """A quorum granted it and some validity time is left."""
        return self.granted >= self.quorum and self.validity > 0

    @property
    def contended(self) -> bool:
        """Enough masters answered that a quorum was possible: the rest said 'held'.

        Otherwise too many failed, and the failure is the masters', not another owner's."""
        return self.granted + self.denied >= self.quorum

    @property
    def lost(self) -> bool:
        """So many masters denied that a quorum can never grant it: our key is gone (for
        extend), whatever the failed masters would have said."""
        return self.denied > self.total - self.quorum

    @property
    def total(self) -> int:
        return self.granted + self.denied + self.failed


def tally(votes: Sequence[Vote], *, ttl: float, elapsed: float, drift_factor: float) -> Tally:
    """Count the votes of one round that took ``elapsed`` seconds on the monotonic clock."""
    granted = denied = 0
    for v in votes:  # one pass: this runs on every round of the hot path
        if v is Vote.GRANTED:
            granted += 1
        elif v is Vote.DENIED:
            denied += 1
    return Tally(
        granted=granted,
        denied=denied,
        failed=len(votes) - granted - denied,
        quorum=quorum(len(votes)),
        validity=validity(ttl, elapsed, drift_factor),
    )


def retry_delay(base: float, rng: random.Random) -> float:
    """A random pause before the next attempt, uniform in [base/2, base]: random so that clients
    that collided once do not collide again in lockstep, never zero so they do not spin."""
    return base * (0.5 + rng.random() / 2)


#: Waiters that split a vote (each won some masters, none a quorum, and no one holds the lock) try
#: again within up to this many seconds, spread out so that one of them reaches every master first.
SPLIT_SPREAD = 0.004


def notice_digest(value: str | bytes) -> str:
    """What a release notice says about the lease: 16 hex characters derived from its value,
    never the token itself (anyone subscribed could read it). Computed once by the client rather
    than by every master's script."""
    data = value.encode() if isinstance(value, str) else value
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def split_retry_delay(waited: float, rng: random.Random) -> float:
    """Pause before trying again after a split vote: random within SPLIT_SPREAD, and shorter the
    longer this waiter has waited already, so that old waiters tend to go first."""
    return rng.random() * SPLIT_SPREAD / (1.0 + waited / 0.01)


def fence_merge(counters: Sequence[int | None], node_count: int) -> int | None:
    """The next fencing token from the counters a round of reads returned (``None`` for a master
    that did not answer): one more than the highest, if a quorum answered.

    Monotonic only because the caller writes the result back to a quorum before using it: any later
    read quorum then meets at least one master that holds it (Lamport's majority register).
    """
    answered = [c for c in counters if c is not None]
    if len(answered) < quorum(node_count):
        return None
    return max(answered) + 1


# --- input validation: every check runs before any network call -------------------------------


def check_seconds(name: str, value: object, *, allow_zero: bool) -> float:
    """``value`` as positive (or non-negative) finite seconds, or ``ValueError`` naming it."""
    if type(value) is float and (0.0 < value <= MAX_SECONDS or (value == 0.0 and allow_zero)):
        # (A float in range, as every lock's TTL and wait: saves 4.8k instructions an engine
        # lock, 1.2%; kept for issue 37's budget. NaN and inf fail both comparisons.)
        return value
    # bool is an int; ``ttl=True`` is a bug, not one second.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:  # an int past any float: far past the bound below
        seconds = math.inf if value > 0 else -math.inf
    if not math.isfinite(seconds):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{name} must be at most {MAX_SECONDS:.0f} seconds (a year), got {value}")
    return seconds or 0.0  # (a zero shared: not a float object per ``wait=0`` lock)


def check_hold_bounds(at_least: object, at_most: object) -> tuple[float | None, float | None]:
    """``at_least`` and ``at_most`` (each None or seconds), or ``ValueError`` naming them: a lock
    kept at least longer than it may be held at most is a contradiction, not a lock."""
    least = None if at_least is None else check_seconds("at_least", at_least, allow_zero=False)
    most = None if at_most is None else check_seconds("at_most", at_most, allow_zero=False)
    if most is not None and most < MIN_TTL:  # it caps the lease: a shorter one is none at all
        raise ValueError(f"at_most must be at least {MIN_TTL} seconds (a lease), got {at_most!r}")
    if least is not None and most is not None and least > most:
        raise ValueError(f"at_least ({at_least!r}) must not exceed at_most ({at_most!r})")
    return least, most


def capped_by(at_most: float | None, ttl: float, max_hold: object) -> tuple[float, float | None]:
    """A lock's TTL and ``max_hold`` (checked), under ``at_most``: its lease never reaches past
    it (the first lease is cut to it, renewal stops there)."""
    hold = None if max_hold is None else check_seconds("max_hold", max_hold, allow_zero=False)
    if at_most is None:
        return ttl, hold
    return min(ttl, check_ttl(at_most)), min(hold or at_most, at_most)


#: The shortest lease: Redis expiries are whole milliseconds, and a lease must outlast its round.
MIN_TTL = 0.01


def check_ttl(value: object) -> float:
    ttl = check_seconds("ttl", value, allow_zero=False)
    # Redis expiries are whole milliseconds: anything shorter would be rounded to no lease at all.
    if ttl < MIN_TTL:
        raise ValueError(f"ttl must be at least {MIN_TTL} seconds, got {value!r}")
    return ttl


def check_node_timeout(
    node_timeout: float, ttl: float, *, names: tuple[str, str] = ("node_timeout", "ttl")
) -> float:
    """``node_timeout`` small next to ``ttl`` (below half of it), or ``ValueError``: a round
    that may take longer than half the lease leaves too little of it even when it succeeds, and
    one slow master would eat the whole lease."""
    if node_timeout >= ttl / 2:
        raise ValueError(
            f"{names[0]} ({node_timeout!r}s) is not small next to {names[1]} ({ttl!r}s): one "
            f"slow master would eat the whole lease"
        )
    return node_timeout


def check_resource(value: object) -> str:
    """A resource name: a non-empty ``str`` of at most ``MAX_RESOURCE_LENGTH`` characters that
    can be written as UTF-8 (no lone surrogate). Control characters are allowed (a name may come
    from a URL): every operator output escapes them."""
    if not isinstance(value, str):
        raise ValueError(f"resource must be a str, got {type(value).__name__} {value!r}")
    if not value:
        raise ValueError("resource must not be empty")
    if len(value) > MAX_RESOURCE_LENGTH:
        raise ValueError(
            f"resource is {len(value)} characters long, more than {MAX_RESOURCE_LENGTH}: "
            f"{value[:40]!r}...; hash long names (django_redlock.keys.bounded_resource does)"
        )
    return _check_utf8("resource", value)


def check_label(value: object) -> str | None:
    """A lock's label: None, or a non-empty ``str`` of at most ``MAX_LABEL_LENGTH`` characters
    that can be written as UTF-8."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ValueError(f"label must be a non-empty str, got {value!r}")
    if len(value) > MAX_LABEL_LENGTH:
        raise ValueError(
            f"label is {len(value)} characters long, more than {MAX_LABEL_LENGTH}: "
            f"{value[:40]!r}... (it is stored in every master's copy of the lock)"
        )
    return _check_utf8("label", value)


def _check_utf8(name: str, value: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{name} has a lone surrogate at position {exc.start} ({value[exc.start]!r}), which "
            f"cannot be written to Redis: {value[:40]!r}"
        ) from None
    return value


def check_resources(values: tuple[object, ...]) -> tuple[str, ...]:
    """The resources of one lock: at least one, each a valid name, none twice."""
    # (One resource first: saves 6.8k instructions a lock, 1.6%; kept for issue 37's budget.)
    if len(values) == 1:
        return (check_resource(values[0]),)
    if not values:
        raise ValueError("a lock needs at least one resource")
    names = tuple(check_resource(v) for v in values)
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"resources listed more than once in one lock: {repeated!r}")
    return names


def check_count(name: str, value: object) -> int | None:
    """None or an int >= 0 (not a bool)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return value


# --- which redis-server a node is -----------------------------------------------------------------


def server_identity(connection_kwargs: Mapping[str, Any]) -> tuple[str, ...]:
    """Which redis-server a node's connection settings reach, as far as can be told without DNS:
    host and port (or socket path), not the db number. Loopback is one host however it is
    spelled (``localhost``, ``127.0.0.1``, ``127.1``, any 127.x.y.z, ``::1``, ``[::1]``,
    ``::ffff:127.0.0.1``, ``0.0.0.0``); other names are compared as written."""
    if "path" in connection_kwargs:
        return ("unix", os.path.normpath(str(connection_kwargs["path"])))
    host = str(connection_kwargs.get("host", "localhost"))
    return (_host_identity(host), str(connection_kwargs.get("port", 6379)))


def _host_identity(host: str) -> str:
    name = host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")
    if name == "localhost" or name.endswith(".localhost"):
        return "loopback"
    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        try:  # the short and numeric IPv4 forms the resolver accepts: 127.1, 2130706433, 0x7f.1
            address = ipaddress.IPv4Address(socket.inet_aton(name))
        except OSError:
            return name  # a DNS name: compared as written
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    if address.is_loopback or address.is_unspecified:  # 0.0.0.0 and :: reach this host too
        return "loopback"
    return str(address)


def duplicate_servers(nodes: Sequence[tuple[str, tuple[str, ...]]]) -> list[str]:
    """The (label, identity) entries that name a redis-server already named, one line each:
    such a server would vote twice, so a "quorum" could be fewer real masters."""
    seen: dict[tuple[str, ...], str] = {}
    out = []
    for label, identity in nodes:
        first = seen.get(identity)
        if first == label:
            out.append(label)
        elif first is not None:
            out.append(f"{label} (the same redis-server as {first})")
        else:
            seen[identity] = label
    return out
