"""A member that is a Redis Cluster: ``redis+cluster://h1:7000,h2:7000/`` (``rediss+cluster://``
for TLS; a user and password in the URL, and query options, are every shard's, as in a plain
URL). This module is its addressing, with no connection of its own: the URL, the hash slot a
request's keys route to, and the slot map (which shard owns which slot) as ``CLUSTER SLOTS``
tells it and ``MOVED`` redirections correct it. ``shards`` makes the member of it.

Why one request goes to one shard: a cluster runs a script only if all its keys hash to one slot
(else ``CROSSSLOT``), and a lock's keys for one resource differ by kind (``lock:``, ``queue:``,
``fence:``, ``readers:``, a permit slot's ``#i``). So on a Redlock with a Cluster member the
engine spells each name in its keys with a hash tag (``tagged``: ``invoice:42`` is keyed as
``{invoice:42}``, on every member), and a lock over several resources needs them in one slot
(one shared tag: ``check_hash_tags``, before any network call). The member is still ONE vote:
its answer is the owning shard's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ..base import protocol

SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
DEFAULT_CLUSTER_PORT = 6379
SLOTS = REDIS_CLUSTER_HASH_SLOTS

#: A shard's address.
Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Seeds:
    """The cluster nodes a member's URL names: any one of them tells the whole slot map."""

    addresses: tuple[Address, ...]


def is_cluster_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SCHEMES


def parse(url: str, masked: str) -> tuple[Seeds, str]:
    """The seeds a Cluster URL names, and the plain URL (host left to the slot map) whose options
    (user, password, query) every shard's connections use; ``ValueError`` naming ``masked`` (the
    URL without its password) if it is not one."""
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    path, query_sep, query = path.partition("?")
    userinfo, at, hosts = netloc.rpartition("@")
    seeds = tuple(_host_port(entry.strip(), masked) for entry in hosts.split(","))
    if path not in ("", "0"):
        raise ValueError(
            f"node {masked!r}: a Redis Cluster has only db 0, got path {path!r}: use "
            f"redis+cluster://host:port[,host:port...]/"
        )
    plain = f"{SCHEMES[scheme.lower()]}://{userinfo}{at}cluster-shard/0"
    return Seeds(seeds), plain + query_sep + query


def _host_port(entry: str, masked: str) -> Address:
    if not entry:
        raise ValueError(f"node {masked!r} lists an empty cluster node address")
    try:
        parts = urlsplit(f"//{entry}")
        port = parts.port or DEFAULT_CLUSTER_PORT
    except ValueError as exc:
        raise ValueError(
            f"node {masked!r} has a bad cluster node address {entry!r}: {exc}"
        ) from None
    if not parts.hostname:
        raise ValueError(f"node {masked!r} has a cluster node address without a host: {entry!r}")
    return parts.hostname, port


def servers_named(spec: Any) -> list[tuple[str, ...]]:
    """The redis-servers a ``NodeSpec`` names (a Cluster member: each of its seeds; else its
    identity): one named by two entries is one failure domain voting twice."""
    if spec.seeds is None:
        return [spec.identity]
    seeds = spec.seeds.addresses
    return sorted({protocol.server_identity({"host": h, "port": p}) for h, p in seeds})


# --- which slot a request goes to -----------------------------------------------------------------


def _as_bytes(key: object) -> bytes:
    return key if isinstance(key, bytes) else str(key).encode("utf-8", "surrogateescape")


def keys_of(command: Sequence[Any]) -> Sequence[Any]:
    """The keys a request touches, as Redis Cluster sees them (the ones it routes by)."""
    name = str(command[0]).upper() if command else ""
    if name in ("EVAL", "EVALSHA"):
        return command[3 : 3 + int(command[2])]
    if name in ("MGET", "DEL", "EXISTS", "UNLINK"):
        return command[1:]
    return command[1:2]


def slot_of(command: Sequence[Any]) -> int | None:
    """The hash slot of ``command``'s first key (None: it has none). Its other keys are in the
    same slot (``check_hash_tags``); if not, the shard answers ``CROSSSLOT``: a failed vote."""
    keys = keys_of(command)
    return key_slot(_as_bytes(keys[0])) if keys else None


def hash_tag(name: str) -> str | None:
    """The hash tag of ``name`` as Redis Cluster reads it (what is inside the first ``{...}``, if
    not empty), or None when it has none."""
    start = name.find("{")
    end = name.find("}", start + 1) if start >= 0 else -1
    return name[start + 1 : end] if end > start + 1 else None


def tagged(resource: str) -> str:
    """``resource`` as a Redlock with a Cluster member spells it in its keys: as written if it
    names a hash tag (the user chose its slot), else within braces, ``{invoice:42}``, so that
    every key of one lock (kinds differ before the name, suffixes after it: never inside the
    tag) hashes to one slot, on whatever shard. So ``name`` and ``{name}`` are one lock there,
    as a user who tagged by hand would expect. (Without a Cluster member names are used as
    written: keys do not change for a Redlock of plain masters.)"""
    return resource if hash_tag(resource) is not None else f"{{{resource}}}"


def check_hash_tags(key_prefix: str, resources: Sequence[str]) -> None:
    """``ValueError`` unless every key a request about ``resources`` touches hashes to one slot:
    their keys' hash tags (``tagged``) are one, and the key prefix has none (it would come
    first, and put every lock of the Redlock in one slot)."""
    if hash_tag(key_prefix) is not None or "{" in key_prefix:
        raise ValueError(
            f"key_prefix {key_prefix!r} must not contain '{{' with a Redis Cluster member: its "
            f"hash tag would put every lock in one slot"
        )
    tags = {r: hash_tag(tagged(r)) for r in resources if isinstance(r, str)}  # (check_resource)
    if len(set(tags.values())) > 1:
        shown = ", ".join(f"{r!r} ({{{t}}})" for r, t in tags.items())
        raise ValueError(
            f"resources {shown} have different hash tags: with a Redis Cluster member one lock's "
            f"resources must share one, so that the member grants all of them or none in one "
            f"script (e.g. '{{order:1}}:a', '{{order:1}}:b')"
        )


# --- the slot map ---------------------------------------------------------------------------------


class SlotMap:
    """Which primary owns each slot, as last told: ``CLUSTER SLOTS`` (``learn``) and ``MOVED``
    (``moved``). Reads and writes of one list entry are atomic in CPython: no lock on the path."""

    def __init__(self) -> None:
        self._owners: list[Address | None] = [None] * SLOTS
        self.known = False

    def owner(self, slot: int) -> Address | None:
        return self._owners[slot]

    def moved(self, slot: int, address: Address) -> None:
        self._owners[slot] = address

    def learn(self, reply: Any) -> None:
        """From a ``CLUSTER SLOTS`` reply: [[start, end, [host, port, id...], replicas...]...].
        Each range filled by one slice assignment (in C): a loop over 16,384 slots held the GIL
        for milliseconds on the map's thread, against rounds with budgets of a few."""
        owners: list[Address | None] = [None] * SLOTS
        for start, end, primary, *_replicas in reply:
            host = primary[0].decode() if isinstance(primary[0], bytes) else str(primary[0])
            first, last = int(start), int(end)
            if 0 <= first <= last < SLOTS:  # (else not a range a cluster has: ignored)
                owners[first : last + 1] = [(host, int(primary[1]))] * (last + 1 - first)
        self._owners = owners
        self.known = True

    def primaries(self) -> list[Address]:
        return sorted({a for a in self._owners if a is not None})


def read_slots(
    seeds: Sequence[Address],
    connection_class: type[redis.connection.AbstractConnection],
    kwargs: dict[str, Any],
    timeout: float,
) -> Any:
    """``CLUSTER SLOTS`` from the first of ``seeds`` that answers (each within ``timeout``);
    ``redis.ConnectionError`` naming each one's problem if none does."""
    problems = []
    for host, port in seeds:
        conn = connection_class(**{**kwargs, "host": host, "port": port})
        conn.socket_timeout = conn.socket_connect_timeout = timeout
        try:
            conn.connect()
            conn.send_command("CLUSTER", "SLOTS")
            reply = conn.read_response()
        except (redis.RedisError, OSError) as exc:
            problems.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
            continue
        finally:
            conn.disconnect()
        if isinstance(reply, list) and reply:
            return reply
        problems.append(f"{host}:{port}: no slots assigned")
    raise redis.ConnectionError(f"no cluster node told the slot map: {'; '.join(problems)}")
