"""The ``REDLOCK`` setting: read in one place, validated, cached, reset on ``setting_changed``.

``problems()`` lists everything wrong with the setting without touching the network; the system
checks show that list, and ``get_config()`` refuses to build a config from a setting that has any
error, naming the bad value. Nothing here runs at import time.
"""

from __future__ import annotations

import difflib
import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from .cache_nodes import cache_node_spec
from .engine import Redlock
from .engine.base import protocol
from .engine.members import cluster
from .engine.members.connections import NodeSpec
from .engine.members.urls import check_url, mask_url
from .engine.redlock import duplicate_masters

DEFAULTS: dict[str, Any] = {
    "NODES": [],
    "KEY_PREFIX": "redlock:",
    "TTL": 30.0,  # seconds: default lease
    "WAIT": 0.0,  # seconds: default wait for a contended lock (0 = one attempt)
    "NODE_TIMEOUT": 0.05,  # seconds: per-master budget for one request
    "CLOCK_DRIFT_FACTOR": 0.01,
    "RETRY_DELAY": 0.1,  # seconds: mean pause between attempts (jittered)
    # seconds: the longest TTL any lock or extension may have (None: no cap). Needed by:
    "MAX_TTL": None,
    # Restart and failover quarantine: a member that restarted, failed over or has been up less
    # than MAX_TTL abstains until leases it may have lost have run out. Off by default: a
    # freshly started Redis (development, CI) would refuse every lock for MAX_TTL; see
    # docs/deployment.md for production.
    "QUARANTINE": False,
}

CACHE_PREFIX = "cache:"

NODES_HINT = (
    'set REDLOCK = {"NODES": ["redis://host-a:6379/0", "redis://host-b:6379/0", '
    '"redis://host-c:6379/0"]} (independent masters, not replicas of each other); '
    'entries may also be "cache:<alias>" naming a Redis cache '
    "(Django's RedisCache or django-redis)"
)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the setting; ``id`` is the system check id suffix (E001, W001...)."""

    id: str
    message: str
    hint: str | None = None

    @property
    def is_error(self) -> bool:
        return self.id.startswith("E")


@dataclass(frozen=True)
class Config:
    nodes: tuple[str, ...] = field(repr=False)  # (URLs: their passwords are not to be shown)
    key_prefix: str
    ttl: float
    wait: float
    node_timeout: float
    drift_factor: float
    retry_delay: float
    max_ttl: float | None = None
    quarantine: bool = False


def raw_setting() -> dict[str, Any]:
    """The user's ``REDLOCK`` over the defaults (a copy: the user's dict is never changed)."""
    if not hasattr(settings, "REDLOCK"):
        raise Undefined(_undefined_message())
    user = settings.REDLOCK
    if not isinstance(user, Mapping):
        raise ImproperlyConfigured(f"REDLOCK must be a dict, got {type(user).__name__} {user!r}")
    return {**DEFAULTS, **user}


class Undefined(ImproperlyConfigured):
    """``settings.REDLOCK`` does not exist (not even empty): often a misspelled name."""


def _undefined_message() -> str:
    names = [name for name in dir(settings) if name.isupper()]
    near = difflib.get_close_matches("REDLOCK", names, n=1, cutoff=0.6)
    return "settings.REDLOCK is not defined" + (
        f" (there is a setting named {near[0]!r}: a misspelling?)" if near else ""
    )


def problems() -> list[Problem]:
    """Everything wrong with ``REDLOCK``, errors and warnings, without any network call."""
    try:
        raw = raw_setting()
    except Undefined as exc:
        return [Problem("E001", str(exc), hint=NODES_HINT)]
    except ImproperlyConfigured as exc:
        return [Problem("E002", str(exc))]
    found: list[Problem] = []
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        found.append(
            Problem(
                "E002",
                f"REDLOCK has unknown keys: {', '.join(map(repr, unknown))}",
                hint=f"known keys: {', '.join(DEFAULTS)}",
            )
        )
    specs, node_problems = _node_specs(raw["NODES"])  # each entry read once, here
    found += node_problems
    for key, allow_zero in (
        ("TTL", False),
        ("WAIT", True),
        ("NODE_TIMEOUT", False),
        ("CLOCK_DRIFT_FACTOR", True),
        ("RETRY_DELAY", False),
    ):
        try:
            protocol.check_seconds(f"REDLOCK[{key!r}]", raw[key], allow_zero=allow_zero)
        except ValueError as exc:
            found.append(Problem("E005", str(exc)))
    if not isinstance(raw["KEY_PREFIX"], str):
        found.append(
            Problem("E005", f"REDLOCK['KEY_PREFIX'] must be a str, got {raw['KEY_PREFIX']!r}")
        )
    found += _quarantine_problems(raw)
    found += _ack_problems(raw, specs)
    # Members that fail over by themselves (Sentinel, or a Cluster's shards with replicas).
    failing_over = [s.label for s in specs if s.service is not None or s.seeds is not None]
    if failing_over and raw["QUARANTINE"] is not True:
        found.append(
            Problem(
                "W003",
                f"REDLOCK['NODES'] has Sentinel or Cluster members "
                f"({', '.join(failing_over)}) without REDLOCK['QUARANTINE']: a "
                f"failover to a replica that missed a lock's key can grant that lock again while "
                f"it is held",
                hint="set QUARANTINE = True and MAX_TTL (see docs/deployment.md)",
            )
        )
    ttl, timeout, factor = raw["TTL"], raw["NODE_TIMEOUT"], raw["CLOCK_DRIFT_FACTOR"]
    if _finite(ttl) and 0 < ttl < 0.01:
        found.append(Problem("E005", f"REDLOCK['TTL'] must be at least 0.01 seconds, got {ttl!r}"))
    if _finite(factor) and factor >= 1:
        found.append(
            Problem("E005", f"REDLOCK['CLOCK_DRIFT_FACTOR'] must be below 1, got {factor!r}")
        )
    if _finite(ttl) and _finite(timeout) and ttl > 0:
        try:
            protocol.check_node_timeout(
                timeout, ttl, names=("REDLOCK['NODE_TIMEOUT']", "REDLOCK['TTL']")
            )
        except ValueError as exc:
            hint = "use a NODE_TIMEOUT of a few milliseconds to a few tens (0.05 by default)"
            found.append(Problem("E006", str(exc), hint=hint))
    return found


def _valid(url: str) -> bool:
    try:
        check_url(url)
    except ValueError:
        return False  # (E003 says so)
    return True


def _quarantine_problems(raw: dict[str, Any]) -> list[Problem]:
    max_ttl, ttl, quarantine = raw["MAX_TTL"], raw["TTL"], raw["QUARANTINE"]
    found = []
    if not isinstance(quarantine, bool):
        found.append(Problem("E005", f"REDLOCK['QUARANTINE'] must be True or False, got "
                                     f"{quarantine!r}"))  # fmt: skip
    if max_ttl is None:
        if quarantine is True:
            found.append(Problem(
                "E007", "REDLOCK['QUARANTINE'] needs REDLOCK['MAX_TTL']: how long a member that "
                "may have lost keys must abstain",
                hint="set MAX_TTL to the longest TTL any lock may have (TTL, or more)",
            ))  # fmt: skip
        return found
    try:
        protocol.check_ttl(protocol.check_seconds("REDLOCK['MAX_TTL']", max_ttl, allow_zero=False))
    except ValueError as exc:
        return [*found, Problem("E005", str(exc).replace("ttl", "REDLOCK['MAX_TTL']", 1))]
    if _finite(ttl) and ttl > max_ttl:
        found.append(
            Problem("E005", f"REDLOCK['TTL'] ({ttl!r}) is over REDLOCK['MAX_TTL'] ({max_ttl!r})")
        )
    return found


def _ack_problems(raw: dict[str, Any], specs: list[NodeSpec]) -> list[Problem]:
    """Members whose ``wait_timeout`` does not fit in ``NODE_TIMEOUT`` (see ``engine.acks``)."""
    budget = raw["NODE_TIMEOUT"]
    if not _finite(budget) or budget <= 0:
        return []  # (E005 says so)
    found = []
    for spec in specs:  # (the valid entries: E003 says what the others are)
        if spec.ack is None:
            continue
        try:
            spec.ack.check_fits(budget, spec.label)
        except ValueError as exc:
            hint = "keep a member's wait_timeout under NODE_TIMEOUT: half of it or less"
            found.append(Problem("E009", f"REDLOCK['NODES'] entry: {exc}", hint=hint))
    return found


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


#: How long the check waits for each seed of a Cluster member.
SEED_TIMEOUT = 0.5


def unreachable_clusters() -> list[Problem]:
    """The Cluster members of ``REDLOCK`` no seed of which tells the slot map: without one, the
    member can never learn where a key goes. The system checks' one network call (each seed
    within ``SEED_TIMEOUT``); not part of ``problems()``, so that a cluster down when a process
    starts fails that member's votes, not the process."""
    try:
        nodes = raw_setting()["NODES"]
    except ImproperlyConfigured:
        return []  # (problems() says why)
    found = []
    for entry in nodes if isinstance(nodes, list | tuple) else []:
        if not (isinstance(entry, str) and cluster.is_cluster_url(entry) and _valid(entry)):
            continue
        spec = NodeSpec.from_url(entry)
        assert spec.seeds is not None  # noqa: S101
        try:
            cluster.read_slots(
                spec.seeds.addresses,
                spec.connection_class,
                dict(spec.connection_kwargs),
                SEED_TIMEOUT,
            )
        except (redis.RedisError, OSError) as exc:
            found.append(
                Problem(
                    "W004",
                    f"REDLOCK['NODES'] entry {spec.label!r}: no seed of this Redis Cluster "
                    f"told its slot map ({exc})",
                    hint="list at least one reachable node of the cluster (host:port), with "
                    "the cluster's user and password if it needs them",
                )
            )
    return found


def _node_specs(nodes: object) -> tuple[list[NodeSpec], list[Problem]]:
    """The specs of the valid ``NODES`` entries, and what is wrong with the list."""
    if isinstance(nodes, str) or not isinstance(nodes, list | tuple):
        shown = repr(mask_url(nodes)) if isinstance(nodes, str) else f"a {type(nodes).__name__}"
        return [], [Problem("E003", f"REDLOCK['NODES'] must be a list, got {shown}")]
    if not nodes:
        return [], [
            Problem(
                "E001",
                "REDLOCK['NODES'] is empty: there are no Redis masters to lock on",
                hint=NODES_HINT,
            )
        ]
    found = []
    specs = []
    for entry in nodes:
        try:
            specs.append(node_spec(entry))
        except (ValueError, ImproperlyConfigured) as exc:
            found.append(Problem("E003", f"REDLOCK['NODES'] entry: {exc}"))
    duplicates = duplicate_masters(specs)
    if duplicates:
        found.append(
            Problem(
                "E004",
                f"REDLOCK['NODES'] lists the same master more than once: {'; '.join(duplicates)}",
                hint="a master listed twice (by any spelling, db number or cache alias) votes "
                "twice, so a 'quorum' could be one real master",
            )
        )
    if len(nodes) == 1:
        found.append(
            Problem(
                "W002",
                "REDLOCK['NODES'] has one master: no fault tolerance (fine for development)",
                hint="a lock held on one master is lost with it; use 3 or 5 independent masters "
                "in production",
            )
        )
    if len(nodes) % 2 == 0:
        found.append(
            Problem(
                "W001",
                f"REDLOCK['NODES'] has an even number of masters ({len(nodes)}): it tolerates no "
                f"more failures than {len(nodes) - 1} would",
                hint="use an odd number of masters (3 or 5)",
            )
        )
    return specs, found


def node_spec(entry: object) -> NodeSpec:
    """A ``NodeSpec`` for one ``NODES`` entry: a Redis URL, or ``cache:<alias>``. No I/O."""
    if isinstance(entry, str) and entry.startswith(CACHE_PREFIX):
        return cache_node_spec(entry[len(CACHE_PREFIX) :])
    # (from_url checks the URL: ValueError naming a bad one; check_url names a non-text one.)
    return NodeSpec.from_url(entry if isinstance(entry, str) else check_url(entry))


@cache
def get_config() -> Config:
    """The validated setting, or ``ImproperlyConfigured`` naming the first bad value."""
    errors = [p for p in problems() if p.is_error]
    if errors:
        raise ImproperlyConfigured(
            "; ".join(p.message for p in errors)
            + (f" ({errors[0].hint})" if errors[0].hint else "")
        )
    raw = raw_setting()
    return Config(
        nodes=tuple(raw["NODES"]),
        key_prefix=raw["KEY_PREFIX"],
        ttl=float(raw["TTL"]),
        wait=float(raw["WAIT"]),
        node_timeout=float(raw["NODE_TIMEOUT"]),
        drift_factor=float(raw["CLOCK_DRIFT_FACTOR"]),
        retry_delay=float(raw["RETRY_DELAY"]),
        max_ttl=None if raw["MAX_TTL"] is None else float(raw["MAX_TTL"]),
        quarantine=raw["QUARANTINE"],
    )


_engine: Redlock | None = None
_building = threading.Lock()


def get_redlock() -> Redlock:
    """The process-wide engine for ``REDLOCK`` (built on first use, never at import; once, also
    when many threads ask first at the same time: an engine is connections and threads)."""
    engine = _engine
    if engine is None:
        with _building:
            engine = _engine or _build_redlock()
    return engine


def _build_redlock() -> Redlock:
    global _engine
    from .contrib import prometheus
    from .observer import DjangoObserver

    config = get_config()
    # The metrics register now, as the engine is built (the app's first use): not inside the
    # first lock this process is handed (~1 ms, on the hand-off's path), nor at import. A
    # failure (a project's metric of the same name) is logged, as the observer's would be: the
    # locks work without their metrics.
    try:
        prometheus.enabled()
    except Exception:  # noqa: BLE001
        logging.getLogger("django_redlock").exception("django_redlock metrics not registered")
    _engine = Redlock(
        [node_spec(n) for n in config.nodes],
        key_prefix=config.key_prefix,
        ttl=config.ttl,
        wait=config.wait,
        node_timeout=config.node_timeout,
        drift_factor=config.drift_factor,
        retry_delay=config.retry_delay,
        max_ttl=config.max_ttl,
        quarantine=config.quarantine,
        observer=DjangoObserver(),
    )
    return _engine


@receiver(setting_changed)
def _reset(*, setting: str, **kwargs: object) -> None:
    global _engine
    if setting in ("REDLOCK", "CACHES"):
        engine, _engine = _engine, None
        if engine is not None:
            engine.close()
        get_config.cache_clear()
