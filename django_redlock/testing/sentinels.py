"""Real Sentinels for tests: a primary, a replica of it, and Sentinel processes watching them
(``redis-server --sentinel``), so that a lock member can be ``redis+sentinel://...`` and a test
can fail it over for real.

    with sentinel_group(tmp_path) as group:
        engine = Redlock([group.url, other_master.url, third_master.url])
        ...
        group.failover()  # SENTINEL FAILOVER: the replica becomes the primary

Sentinel's timings are shortened (``down-after-milliseconds``) so that a group starts in well
under a second and a failover takes one or two.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import redis

from .masters import LocalMaster, find_redis_server, free_port
from .proxy import DelayProxy

SERVICE = "mymaster"


class LocalSentinel(LocalMaster):
    """One ``redis-server --sentinel`` on 127.0.0.1, watching one primary."""

    def __init__(self, workdir: Path, primary: LocalMaster, service: str = SERVICE) -> None:
        super().__init__(workdir)
        self.primary_port = primary.port
        self.service = service

    def command(self) -> list[str]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "sentinel.conf"  # Sentinel rewrites it: one of its own
        config.write_text(
            f"port {self.port}\n"
            "bind 127.0.0.1\n"
            f"dir {self.workdir}\n"
            f"logfile {self.workdir / 'sentinel.log'}\n"
            f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 1\n"
            f"sentinel down-after-milliseconds {self.service} 1000\n"
            # (Long: it is also how long Sentinel leaves a replica that replicates through a
            # proxy before it "fixes" the replica to the primary's own address.)
            f"sentinel failover-timeout {self.service} 60000\n"
        )
        return [find_redis_server(), str(config), "--sentinel"]

    def primary(self) -> tuple[str, int] | None:
        reply: Any = self.call("SENTINEL", "get-master-addr-by-name", self.service)
        if not reply:
            return None
        host, port = (x.decode() for x in reply)
        return host, int(port)

    def replicas_ready(self) -> int:
        """Replicas this Sentinel knows, is connected to and sees in sync with the primary."""
        replicas: Any = self.call("SENTINEL", "replicas", self.service)
        return sum(
            1
            for r in replicas
            if r.get(b"flags") == b"slave" and r.get(b"master-link-status") == b"ok"
        )


class SentinelGroup:
    """A primary, one replica, and the Sentinels that watch them."""

    def __init__(
        self, primary: LocalMaster, replica: LocalMaster, sentinels: list[LocalSentinel]
    ) -> None:
        self.servers = {primary.port: primary, replica.port: replica}
        self.sentinels = sentinels
        self.service = sentinels[0].service
        #: The replication link's proxy, if the group was started with ``lag=True``.
        self.replication: DelayProxy | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    @property
    def primary(self) -> LocalMaster:
        address = self.sentinels[0].primary()
        assert address is not None  # noqa: S101
        return self.servers[address[1]]

    @property
    def replica(self) -> LocalMaster:
        primary = self.primary
        return next(s for s in self.servers.values() if s is not primary)

    def failover(self, *, demoted: bool = False, timeout: float = 20.0) -> LocalMaster:
        """``SENTINEL FAILOVER``; returns the new primary once the Sentinels name it and it
        accepts writes (they announced ``+switch-master``). ``demoted``: also wait until the
        old primary is its replica (Sentinel reconfigures it some 8-10 s later; until then it
        still takes writes from clients that have not moved)."""
        old, new = self.primary, self.replica
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sentinels[0].call("SENTINEL", "FAILOVER", self.service)
                break
            except redis.ResponseError as exc:
                # NOGOODSLAVE: this Sentinel has not heard from the replica lately enough yet
                # (it connects to it once the primary names it).
                if "NOGOODSLAVE" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        while True:
            if all(s.primary() == ("127.0.0.1", new.port) for s in self.sentinels):
                if _role(new) == b"master" and (not demoted or _role(old) == b"slave"):
                    return new
            if time.monotonic() > deadline:
                raise RuntimeError(f"failover of {self.service} from {old} to {new} timed out")
            time.sleep(0.05)


def _replicas_ready(sentinel: LocalSentinel) -> bool:
    return sentinel.replicas_ready() > 0


def _info(server: LocalMaster, section: str) -> Any:
    return server.call("INFO", section)


def _role(server: LocalMaster) -> object:
    role = server.call("ROLE")
    return role[0] if isinstance(role, list) else None


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout} s")
        time.sleep(0.02)


@contextlib.contextmanager
def primary_and_replica(
    workdir: Path, *, lag: bool = False
) -> Iterator[tuple[LocalMaster, LocalMaster, DelayProxy | None]]:
    """Start a primary and a replica of it, in sync; stop both on exit. ``lag``: the replica
    replicates through a ``DelayProxy`` (returned third: set its ``delay`` to make the replica
    lag, as replication is asynchronous)."""
    with contextlib.ExitStack() as own:
        # No 5 s wait before a replica's first sync (Redis 7's default diskless delay); the
        # replica needs it too: after a failover it is the primary.
        quick = ("--repl-diskless-sync-delay", "0")
        primary = LocalMaster(workdir / "primary", None, *quick).start()
        own.callback(primary.stop)
        replication = own.enter_context(DelayProxy(primary.port)) if lag else None
        upstream = primary.port if replication is None else replication.port
        replica = LocalMaster(
            workdir / "replica", free_port(), *quick, "--replicaof", "127.0.0.1", str(upstream)
        )
        own.callback(replica.stop)
        replica.start()
        wait_until(
            lambda: _info(replica, "replication").get("master_link_status") == "up",
            "the replica's sync",
        )
        yield primary, replica, replication


@contextlib.contextmanager
def sentinel_group(
    workdir: Path, *, sentinels: int = 1, service: str = SERVICE, lag: bool = False
) -> Iterator[SentinelGroup]:
    """Start a primary, a replica of it (in sync), and ``sentinels`` Sentinels that know both;
    stop them all on exit. ``lag``: the replica replicates through a ``DelayProxy``
    (``group.replication``: set its ``delay`` to make the replica lag, as replication is
    asynchronous, and a failover then promotes a replica without the newest writes)."""
    with contextlib.ExitStack() as stack:
        primary, replica, replication = stack.enter_context(primary_and_replica(workdir, lag=lag))
        watchers: list[LocalSentinel] = []
        for i in range(sentinels):
            sentinel = LocalSentinel(workdir / f"sentinel{i}", primary, service)
            stack.callback(sentinel.stop)
            sentinel.start()
            watchers.append(sentinel)
        for sentinel in watchers:
            wait_until(partial(_replicas_ready, sentinel), "Sentinel finding the replica")
        group = SentinelGroup(primary, replica, watchers)
        group.replication = replication
        yield group
