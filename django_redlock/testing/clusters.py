"""A real Redis Cluster for tests: three primaries (``redis-server --cluster-enabled yes``) joined
by ``redis-cli --cluster create``, so that a lock member can be ``redis+cluster://...`` and a test
can migrate a slot, or kill a shard, for real. No replicas unless asked (``replicas=``: that many
of the first primary, for a failover test; a 2-core machine runs it), and
``cluster-require-full-coverage no``: a dead shard fails only the keys in its slots.

    with local_cluster(tmp_path) as cluster:
        engine = Redlock([cluster.url, other_master.url, third_master.url])
        with engine.lock("{invoice:42}"):
            ...
        cluster.migrate_slot(slot, to=cluster.shards[1])  # the next request meets MOVED

``redis-cli`` comes with the Redis server package (Debian: ``redis-tools``); it is looked for next
to ``redis-server``, then on PATH.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from redis.crc import key_slot

from .masters import LocalMaster, find_redis_server


class ClusterShard(LocalMaster):
    """One cluster-enabled redis-server on 127.0.0.1 (and on ``tls_port`` with TLS, if given)."""

    #: Its TLS port, when the cluster was started with ``tls``.
    tls_port: int | None = None

    def command(self) -> list[str]:
        return [
            *super().command(),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.workdir / "nodes.conf"),
            "--cluster-node-timeout", "2000",
            "--cluster-require-full-coverage", "no",
        ]  # fmt: skip

    def node_id(self) -> str:
        return str(_text(self.call("CLUSTER", "MYID")))


def cluster_port() -> int:
    """A free loopback port whose cluster bus port (10000 higher, so at most 55535) is free too."""
    while True:
        port = random.randint(20000, 55535)  # noqa: S311 (a port, not a secret)
        try:
            for each in (port, port + 10000):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", each))
        except OSError:
            continue
        return port


def find_redis_cli() -> str:
    """``redis-cli`` next to the ``redis-server`` we use, else on PATH."""
    beside = Path(find_redis_server()).with_name("redis-cli")
    if beside.exists():
        return str(beside)
    found = shutil.which("redis-cli")
    if found is None:
        raise RuntimeError(
            "redis-cli not found (it ships with redis-server; on Debian: apt-get install "
            "redis-tools): it creates the test cluster"
        )
    return found


class LocalCluster:
    """Primaries joined into one cluster, the slots split evenly between them."""

    def __init__(self, shards: list[ClusterShard], ca: Path | None = None) -> None:
        self.shards = shards
        self.ca = ca
        #: Replicas of ``shards[0]`` (``local_cluster(replicas=...)``).
        self.replicas: list[ClusterShard] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{s.port}" for s in self.shards) + "/"

    @property
    def tls_url(self) -> str | None:
        """``rediss+cluster://`` on the TLS ports, checking the certificates against the CA
        (None: started without TLS). Redis tells a TLS client the TLS ports of the shards."""
        if self.ca is None:
            return None
        hosts = ",".join(f"127.0.0.1:{s.tls_port}" for s in self.shards)
        return f"rediss+cluster://{hosts}/?ssl_ca_certs={self.ca}&ssl_cert_reqs=required"

    def owner(self, key: str) -> ClusterShard:
        """The shard that owns ``key``'s slot now (as the first live shard says)."""
        slot = key_slot(key.encode())
        live = next(s for s in self.shards if s.alive)
        for start, end, primary, *_ in live.call("CLUSTER", "SLOTS"):  # type: ignore[attr-defined]
            if int(start) <= slot <= int(end):
                return next(s for s in self.shards if s.port == int(primary[1]))
        raise LookupError(f"no shard owns slot {slot}")

    def keys(self, pattern: str = "*") -> list[bytes]:
        """Every key matching ``pattern`` on every live shard."""
        found: list[bytes] = []
        for shard in self.shards:
            if shard.alive:
                found += shard.call("KEYS", pattern)  # type: ignore[arg-type]
        return sorted(found)

    def where(self, key: str) -> list[ClusterShard]:
        """The live shards that have ``key`` (each asked for its own keys: no redirection)."""
        pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in key)
        return [s for s in self.shards if s.alive and s.call("KEYS", pattern)]

    def start_migration(self, slot: int, to: ClusterShard) -> ClusterShard:
        """Mark ``slot`` MIGRATING on its owner and IMPORTING on ``to`` (requests for keys the
        owner does not have get ``ASK``); returns the owner."""
        source = self._owner_of_slot(slot)
        to.call("CLUSTER", "SETSLOT", slot, "IMPORTING", source.node_id())
        source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", to.node_id())
        return source

    def finish_migration(self, slot: int, source: ClusterShard, to: ClusterShard) -> None:
        """Move ``slot``'s keys to ``to`` and give it the slot (on every shard: requests to the
        old owner get ``MOVED``)."""
        while True:
            keys: Any = source.call("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if not keys:
                break
            # (With tls-cluster, MIGRATE speaks TLS: to the target's TLS port.)
            port = to.tls_port or to.port
            source.call("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", *keys)
        for shard in self.shards:
            if shard.alive:
                shard.call("CLUSTER", "SETSLOT", slot, "NODE", to.node_id())

    def migrate_slot(self, slot: int, to: ClusterShard) -> ClusterShard:
        """Move ``slot`` (and its keys) to ``to``, as ``redis-cli --cluster reshard`` does;
        returns its former owner."""
        source = self.start_migration(slot, to)
        self.finish_migration(slot, source, to)
        return source

    def _owner_of_slot(self, slot: int) -> ClusterShard:
        for shard in self.shards:
            if shard.alive:
                for start, end, primary, *_ in shard.call("CLUSTER", "SLOTS"):  # type: ignore[attr-defined]
                    if int(start) <= slot <= int(end):
                        return next(s for s in self.shards if s.port == int(primary[1]))
        raise LookupError(f"no shard owns slot {slot}")

    def wait_ok(self, timeout: float = 20.0) -> None:
        """Until every live shard says ``cluster_state:ok`` and agrees on the slot map."""
        deadline = time.monotonic() + timeout
        while True:
            live = [s for s in self.shards if s.alive]
            states = [_text(s.call("CLUSTER", "INFO")) for s in live]
            maps = {repr(sorted(map(repr, s.call("CLUSTER", "SLOTS")))) for s in live}  # type: ignore[call-overload]
            if all("cluster_state:ok" in st for st in states) and len(maps) == 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"cluster not ok within {timeout} s: {states}")
            time.sleep(0.05)

    def add_replica(self, replica: ClusterShard) -> None:
        """Join the started ``replica`` to the cluster as a replica of ``shards[0]``, and wait
        until it has synced."""
        self.replicas.append(replica)
        primary = self.shards[0]
        _cli(
            "--cluster", "add-node", f"127.0.0.1:{replica.port}", f"127.0.0.1:{primary.port}",
            "--cluster-slave", "--cluster-master-id", primary.node_id(),
        )  # fmt: skip
        deadline = time.monotonic() + 20.0
        while replica.call("INFO", "replication").get("master_link_status") != "up":  # type: ignore[attr-defined]
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica {replica.port} did not sync within 20 s")
            time.sleep(0.05)

    def stop(self) -> None:
        for shard in [*self.shards, *self.replicas]:
            shard.stop()


def _text(reply: object) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _cli(*args: str) -> None:
    done = subprocess.run(  # noqa: S603 (our own binary, our own arguments)
        [find_redis_cli(), *args], capture_output=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"redis-cli {args[:2]} failed: {done.stdout.decode()[-2000:]}"
            f"{done.stderr.decode()[-2000:]}"
        )


@contextlib.contextmanager
def local_cluster(
    workdir: Path | None = None,
    primaries: int = 3,
    *extra_args: str,
    tls: Mapping[str, Path] | None = None,
    replicas: int = 0,
) -> Iterator[LocalCluster]:
    """Start a cluster of ``primaries`` shards (at least 3, as ``redis-cli --cluster create``
    asks); stop it (and remove its files) on exit. ``tls``: the files ``server.crt``,
    ``server.key`` and ``ca.crt``: each shard also listens with TLS (``tls_port``), and the
    shards talk to each other with TLS (``tls-cluster``); needs a redis-server built with TLS.
    ``replicas``: that many replicas of the first primary (not with ``tls``), synced before the
    cluster is yielded."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="redlock-")))
        shards: list[ClusterShard] = []
        made = LocalCluster(shards, None if tls is None else tls["ca.crt"])
        stack.callback(made.stop)
        for i in range(primaries):
            for attempt in range(5):  # a free port can be taken between probe and bind
                # (Its cluster bus is 10000 higher too, over TLS: a cluster port, as the plain one.)
                tls_port = cluster_port() if tls else None
                tls_args = (
                    []
                    if tls is None
                    else [
                        "--tls-port", str(tls_port), "--tls-cluster", "yes",
                        "--tls-cert-file", str(tls["server.crt"]),
                        "--tls-key-file", str(tls["server.key"]),
                        "--tls-ca-cert-file", str(tls["ca.crt"]),
                        "--tls-auth-clients", "no",
                    ]
                )  # fmt: skip
                shard = ClusterShard(workdir / f"shard{i}", cluster_port(), *extra_args, *tls_args)
                shard.tls_port = tls_port
                try:
                    shard.start()
                    shards.append(shard)
                    break
                except RuntimeError:
                    if attempt == 4:
                        raise
        addresses = [f"127.0.0.1:{s.port}" for s in shards]
        _cli("--cluster", "create", *addresses, "--cluster-yes")
        made.wait_ok()
        for i in range(replicas):
            replica = ClusterShard(workdir / f"replica{i}", cluster_port(), *extra_args)
            replica.start()
            made.add_replica(replica)
        yield made


__all__ = ["ClusterShard", "LocalCluster", "cluster_port", "find_redis_cli", "local_cluster"]
