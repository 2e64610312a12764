"""How each lock master is doing, for ``manage.py redlock_status`` and the admin's node panel.

One probe per master, all at once in threads, so that a dead or paused master costs one timeout,
not one per master. Each probe asks a plain redis-py client (``admin_client``) for: a PING round
trip, the server version, role and run_id (INFO), persistence and eviction settings (CONFIG GET,
which an ACL may refuse: then "unknown"), and TIME for its clock. Nothing here takes or changes a
lock.

The verdict is one of three (``OK``, ``DEGRADED``, ``NO_QUORUM``), said the same way by the status
command (text, JSON and exit status) and the admin. Masters that report one ``run_id`` are one
redis-server listed twice: they count once, and that is an error.

Clocks: Redis keeps each expiry as an absolute time on the master's own wall clock, so a master
whose clock steps forward drops its lock keys early. Each probe reads every master's TIME and
warns when one is off from this host, or from the other masters, by more than ``SKEW_WARNING``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import redis

from ..engine import Redlock
from ..engine.base.errors import lacks_scripting
from ..engine.members.acks import REASON as ACK_REASON
from ..engine.members.connections import Node
from ..engine.members.shards import ClusterMember

T = TypeVar("T")

#: Seconds a probe waits for each answer. Longer than a lock's NODE_TIMEOUT on purpose: a health
#: check on a busy machine should not call a slow-but-alive master dead.
PROBE_TIMEOUT = 0.5

#: A clock offset above this many seconds gets a warning. Redlock needs clocks that advance at
#: the same *rate*, not that agree; but a large offset means a clock that is not kept by a slewing
#: time sync, or one that stepped, and a step forward on a master expires its locks early.
SKEW_WARNING = 1.0

UNKNOWN = "unknown"

OK = "OK"
DEGRADED = "DEGRADED"
NO_QUORUM = "NO QUORUM"


@dataclass(frozen=True)
class NodeHealth:
    """What one master said. Times are seconds; ``clock_skew`` is the master's clock minus ours."""

    node: str  # address, password masked
    reachable: bool
    error: str | None = None
    rtt: float | None = None
    version: str = UNKNOWN
    role: str = UNKNOWN
    appendonly: str = UNKNOWN
    appendfsync: str = UNKNOWN
    maxmemory_policy: str = UNKNOWN
    clock_skew: float | None = None
    run_id: str | None = None  # the redis-server process: two entries with one are one server
    warnings: tuple[str, ...] = ()
    #: Quarantine (when on): why this master's votes do not count now, and for how long.
    abstains: str | None = None

    @property
    def rtt_ms(self) -> float | None:
        return None if self.rtt is None else self.rtt * 1000


@dataclass(frozen=True)
class Health:
    """All masters, and whether enough of them answer to take a lock."""

    nodes: tuple[NodeHealth, ...]
    quorum: int

    @property
    def reachable(self) -> int:
        """Distinct redis-servers that answered (entries sharing a run_id count once)."""
        answered = [n for n in self.nodes if n.reachable]
        return len({n.run_id or n.node for n in answered})

    @property
    def abstaining(self) -> int:
        """Reachable masters whose votes do not count now (quarantine)."""
        return sum(1 for n in self.nodes if n.reachable and n.abstains)

    @property
    def spare(self) -> int:
        """How many more masters may fail before locking stops (negative: it has stopped)."""
        return self.reachable - self.abstaining - self.quorum

    @property
    def has_quorum(self) -> bool:
        return self.spare >= 0

    @property
    def single(self) -> bool:
        """One master (development): it answers or not; there is nothing to degrade."""
        return len(self.nodes) == 1

    @property
    def verdict(self) -> str:
        if self.single and self.spare == 0:
            return OK
        return OK if self.spare > 0 else DEGRADED if self.spare == 0 else NO_QUORUM

    @property
    def summary(self) -> str:
        if self.single and self.verdict == OK:
            consequence = "single master, no fault tolerance"
        else:
            consequence = {
                OK: f"can lose {self.spare} more master{'s' if self.spare > 1 else ''}",
                DEGRADED: "can lose no more masters: one more failure stops all locking",
                NO_QUORUM: "locks can be neither acquired nor extended",
            }[self.verdict]
        abstaining = f" ({self.abstaining} abstaining)" if self.abstaining else ""
        return (
            f"{self.reachable} of {len(self.nodes)} masters reachable{abstaining}, quorum "
            f"{self.quorum}: {self.verdict} ({consequence})"
        )

    @property
    def same_servers(self) -> list[str]:
        """One line per redis-server listed under several entries (by run_id)."""
        by_run: dict[str, list[str]] = {}
        for node in self.nodes:
            if node.run_id:
                by_run.setdefault(node.run_id, []).append(node.node)
        return [
            f"{' and '.join(labels)} are one redis-server (run_id {run_id[:8]}): it votes "
            f"{len(labels)} times, so a quorum may be fewer real masters; list it once"
            for run_id, labels in by_run.items()
            if len(labels) > 1
        ]

    @property
    def clock_spread(self) -> float | None:
        """Seconds between the fastest and the slowest master clock (None: fewer than two read)."""
        skews = [n.clock_skew for n in self.nodes if n.clock_skew is not None]
        return max(skews) - min(skews) if len(skews) > 1 else None

    @property
    def clock_warning(self) -> str | None:
        spread = self.clock_spread
        if spread is None or spread <= SKEW_WARNING:
            return None
        return (
            f"master clocks differ by {spread:.3f} s from each other: Redis expires keys by each "
            f"master's own wall clock, so a clock stepped forward on a majority lets a second "
            f"owner in while the first holds the lock; keep clocks slewed (NTP/chrony), never "
            f"stepped"
        )


def probe_all(redlock: Redlock, *, timeout: float = PROBE_TIMEOUT) -> Health:
    """Probe every master of ``redlock`` concurrently."""
    with ThreadPoolExecutor(
        max_workers=len(redlock.nodes), thread_name_prefix="redlock-probe"
    ) as pool:
        results = tuple(pool.map(lambda node: probe(node, timeout=timeout), redlock.nodes))
    return Health(results, redlock.quorum)


def abstention(node: Node, info: dict[str, Any], replicas_for: float | None = None) -> str | None:
    """Why ``node``'s votes do not count now (None: they do), as the engine counts them: its
    replica acknowledgement (``?wait_replicas=``: too few replicas acknowledge, or it sits out
    in this process after a missed one), and quarantine (when on): what this process's engine
    decided on its connections, or else what the member's INFO says now, which any process
    reads alike: its uptime, its role, and a promotion since it started (``second_repl_offset``:
    a failover; ``replicas_for``: how long its longest-connected replica has followed it, None
    if none or unknown)."""
    acks = node.acks
    if acks is not None:
        short = acks.ask.cannot_vote(info)
        if short is not None:
            return f"{ACK_REASON}: {short}"
        left = acks.until - time.monotonic()
        if left > 0:
            return f"{ACK_REASON}: a grant went unacknowledged; sits out {left:.1f} s more"
    watch = node.watch
    if watch is None:
        return None
    now = time.monotonic()
    if watch.abstaining(now):
        return f"quarantine: {watch.reason}; abstains {watch.until - now:.1f} s more"
    uptime = info.get("uptime_in_seconds")
    if isinstance(uptime, int) and uptime < watch.max_ttl:
        return f"quarantine: up only {uptime} s; abstains {watch.max_ttl - uptime:.1f} s more"
    role = info.get("role")
    if role not in (None, "master"):
        return f"quarantine: not a primary (role {role})"
    if promoted(info) and (replicas_for is None or replicas_for < watch.max_ttl):
        # When it was promoted no process that did not see it can read (a Sentinel does not
        # say): the replicas that follow it now came after, so once one has followed it for
        # MAX_TTL, the failover is older than that and every process votes with it again.
        return (
            f"quarantine: promoted from a replica since it started (a failover): the processes "
            f"that saw it abstain {watch.max_ttl:.0f} s after it, and "
            + (
                "no replica follows it (or CLIENT LIST was refused) to tell how long ago"
                if replicas_for is None
                else f"its replicas have followed it only {replicas_for:.0f} s"
            )
        )
    return None


def promoted(info: dict[str, Any]) -> bool:
    """Whether a primary's INFO says it was promoted from a replica since it started."""
    return info.get("second_repl_offset", -1) not in (-1, "-1")


def replicas_following(client: redis.Redis) -> float | None:
    """Seconds the longest-connected replica of this primary has followed it (CLIENT LIST's
    ``age``); None if none does, or it would not say."""
    reply = _ask(client.client_list, "replica")
    ages = [float(c["age"]) for c in reply or () if "age" in c]
    return max(ages) if ages else None


def probe(node: Node, *, timeout: float = PROBE_TIMEOUT) -> NodeHealth:
    """Probe one master; never raises for a master's failure (it is reported instead)."""
    if isinstance(node, ClusterMember):
        return probe_cluster(node, timeout=timeout)
    client = admin_client(node, timeout)
    try:
        client.ping()  # connects (and authenticates): not part of the round trip we report
        started = time.monotonic()
        client.ping()
        rtt = time.monotonic() - started
        info = _ask(client.info)  # default sections: server, replication, persistence, memory...
        # (A promoted primary of a quarantined member: how long its replicas have followed it.)
        followed = replicas_following(client) if node.watch and promoted(info or {}) else None
        config = _ask(client.config_get, "*") or {}  # one round trip; ACL may refuse CONFIG
        skew = _clock_skew(client)
        no_scripts = scripting_missing(client)
    except (redis.RedisError, OSError) as exc:
        return NodeHealth(node.label, reachable=False, error=failure_text(exc))
    finally:
        client.close()
    info = info or {}
    health = NodeHealth(
        node.label,
        reachable=True,
        rtt=rtt,
        version=server_version(info),
        role=str(info.get("role", UNKNOWN)),
        run_id=str(info["run_id"]) if "run_id" in info else None,
        appendonly=_setting(config, "appendonly", _aof_from_info(info)),
        appendfsync=_setting(config, "appendfsync", UNKNOWN),
        maxmemory_policy=_setting(config, "maxmemory-policy", info.get("maxmemory_policy")),
        clock_skew=skew,
        abstains=no_scripts or abstention(node, info, followed),
    )
    return _with_warnings(health, node.timeout)


def server_version(info: dict[str, Any]) -> str:
    """The server's own name and version. Valkey reports ``redis_version:7.2.4`` whatever its
    release, for clients that compare versions; its own is ``valkey_version``."""
    valkey = info.get("valkey_version")
    if valkey is not None:
        return f"{info.get('server_name', 'valkey')} {valkey}"
    return str(info.get("redis_version", UNKNOWN))


def scripting_missing(client: redis.Redis) -> str | None:
    """Why this master cannot run our Lua scripts (None: it can, or an ACL will not say). A
    server may run without them (Valkey with its ``lua`` module unloaded): it still grants a
    lock (``SET NX``) but can neither release nor extend one, so its vote is worth nothing."""
    try:
        client.eval("return 1", 0)
    except redis.ResponseError as exc:
        text = lacks_scripting(exc)  # the engine's own test: what makes a member abstain
        if text is not None:
            return (
                f"scripting: cannot run Lua scripts ({text}): it would grant locks it can neither "
                "release nor extend; load its scripting engine (Valkey: the lua module)"
            )
    return None


def probe_cluster(member: ClusterMember, *, timeout: float = PROBE_TIMEOUT) -> NodeHealth:
    """A Redis Cluster member: every primary of its slot map, each probed as a master. It is
    reachable only if all are (a shard down fails the member's vote for the keys it owns); its
    round trip is the slowest shard's, its warnings each shard's, named."""
    try:
        member.refresh(timeout)
    except (redis.RedisError, OSError) as exc:
        return NodeHealth(
            member.label, reachable=False, error=f"no seed told the slot map: {failure_text(exc)}"
        )
    shards = [probe(member.shard(address), timeout=timeout) for address in member.map.primaries()]
    down = [shard for shard in shards if not shard.reachable]
    if down:
        return NodeHealth(
            member.label,
            reachable=False,
            error="; ".join(f"{shard.node}: {shard.error}" for shard in down)
            + " (votes for the keys in its slots fail)",
        )
    return replace(
        shards[0],
        node=member.label,
        rtt=max(shard.rtt or 0.0 for shard in shards),
        run_id=None,  # several processes
        warnings=tuple(f"{shard.node}: {w}" for shard in shards for w in shard.warnings),
        abstains="; ".join(f"{s.node}: {s.abstains}" for s in shards if s.abstains) or None,
    )


def failure_text(exc: BaseException) -> str:
    """Why a master could not be probed, in the words an operator acts on: a wrong password is
    not an unreachable master, and a port that is not Redis gets a hint instead of a bare
    protocol error."""
    if isinstance(exc, redis.AuthenticationError) or (
        isinstance(exc, redis.ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))
    ):
        return (
            f"authentication failed: {exc} (check the user and password in this master's URL "
            f"or cache settings)"
        )
    if isinstance(exc, redis.exceptions.InvalidResponse):
        return (
            f"not a Redis server? it answered outside the Redis protocol ({exc}): check the "
            f"host and port of this master"
        )
    return f"unreachable: {type(exc).__name__}: {exc}"


def admin_client(node: Node, timeout: float) -> redis.Redis:
    """``node.client()`` with ``timeout`` for connecting and for each answer; close it. (A Redis
    Cluster member's is a ``RedisCluster``: SCAN and pipelines reach every primary.)"""
    return node.client(timeout)


def _ask(command: Callable[..., T], *args: Any) -> T | None:
    """A command an ACL or a renamed command may refuse: None then, not a failed master."""
    try:
        return command(*args)
    except redis.ResponseError:
        return None


def _clock_skew(client: redis.Redis) -> float | None:
    before = time.time()  # wall clock on purpose: we compare wall clocks here, nothing else
    reply = _ask(client.time)
    after = time.time()
    if reply is None:
        return None
    seconds, micros = reply
    return seconds + micros / 1e6 - (before + after) / 2


def _setting(config: dict[Any, Any], name: str, fallback: object) -> str:
    value = config.get(name, config.get(name.encode()))
    if value is None:
        value = fallback if fallback is not None else UNKNOWN
    return value.decode() if isinstance(value, bytes) else str(value)


def _aof_from_info(info: dict[str, Any]) -> str:
    aof = info.get("aof_enabled")
    return UNKNOWN if aof is None else ("yes" if int(aof) else "no")


def _with_warnings(health: NodeHealth, lock_timeout: float) -> NodeHealth:
    warnings = []
    if health.role not in ("master", UNKNOWN):
        warnings.append(
            f"role is {health.role!r}, not master: a replica is not an independent master; "
            f"Redlock needs N masters that do not replicate each other"
        )
    if health.maxmemory_policy != "noeviction":
        warnings.append(
            f"maxmemory-policy is {health.maxmemory_policy!r}: under memory pressure Redis may "
            f"evict lock keys and hand a held lock to a second owner; set it to 'noeviction'"
        )
    if health.appendonly != "yes" or health.appendfsync != "always":
        warnings.append(
            f"persistence appendonly={health.appendonly} appendfsync={health.appendfsync}: "
            f"after a crash this master may come back without its locks; restart it only after "
            f"the longest lock TTL has passed (or use appendonly yes, appendfsync always)"
        )
    if health.rtt is not None and health.rtt >= lock_timeout:
        warnings.append(
            f"round trip {health.rtt * 1000:.1f} ms is not below NODE_TIMEOUT "
            f"({lock_timeout * 1000:.0f} ms): lock requests to this master will time out"
        )
    if health.clock_skew is not None and abs(health.clock_skew) > SKEW_WARNING:
        warnings.append(
            f"clock is {health.clock_skew:+.3f} s off this host's: Redis expires lock keys by "
            f"this master's wall clock, so a step forward ends their leases early; check its time "
            f"sync (slew, never step)"
        )
    return replace(health, warnings=tuple(warnings))
