"""A Sentinel zone on one host of the separate-hosts harness (``hosts.py``): a primary and three
Sentinels watching it, all in one master host's namespace, so that a partition of that host
silences the whole zone at once, as a zone cut off by dropped packets would be. A client host
reaches them at the host's address; the controller at unix sockets no network fault touches.

``silent_zone_cycles`` is the measurement: acquire+release cycles on a Redlock whose first
member is the zone, healthy and then with the zone partitioned.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django_redlock.testing.masters import find_redis_server

from .host_scenarios import Probe, silenced
from .hosts import HostCluster, HostMaster, Network

SERVICE = "zone"
PRIMARY_PORT = 6390
SENTINEL_PORTS = (26379, 26380, 26381)


class ZoneServer(HostMaster):
    """A redis-server of the zone: on ``port`` of its host (its address and loopback)."""

    def __init__(self, workdir: Path, network: Network, host: str, socket: Path, port: int):
        super().__init__(workdir, network, host, socket)
        self.port = port


class ZoneSentinel(ZoneServer):
    """A Sentinel of the zone, watching the zone's primary at the host's address."""

    def command(self) -> list[str]:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "sentinel.conf"  # (Sentinel rewrites it: one of its own)
        config.write_text(
            f"port {self.port}\n"
            f"bind {self.address} 127.0.0.1\n"
            "protected-mode no\n"
            f"unixsocket {self.socket}\n"
            "unixsocketperm 700\n"
            f"dir {self.workdir}\n"
            f"logfile {self.workdir / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} {self.address} {PRIMARY_PORT} 2\n"
            f"sentinel down-after-milliseconds {SERVICE} 60000\n"  # (no failover meanwhile)
        )
        return [*self.network.exec_prefix(self.host), find_redis_server(), str(config),
                "--sentinel"]  # fmt: skip


@contextlib.contextmanager
def sentinel_zone(cluster: HostCluster, host: str = "m0") -> Iterator[str]:
    """Start the zone on ``host``; yields the member's URL (``redis+sentinel://``)."""
    network = cluster.network
    runtime, workdir = cluster.runtime, cluster.workdir / "zone"
    with contextlib.ExitStack() as stack:
        primary = ZoneServer(workdir / "primary", network, host, runtime / "zp", PRIMARY_PORT)
        stack.callback(primary.stop)
        primary.start()
        for i, port in enumerate(SENTINEL_PORTS):
            sentinel = ZoneSentinel(workdir / f"s{i}", network, host, runtime / f"zs{i}", port)
            stack.callback(sentinel.stop)
            sentinel.start()
        address = network.address(host)
        sentinels = ",".join(f"{address}:{port}" for port in SENTINEL_PORTS)
        yield f"redis+sentinel://{sentinels}/{SERVICE}/0"


@dataclass(frozen=True)
class ZoneCycles:
    budget: float
    healthy: list[float]
    silent: list[float]
    window: float

    @property
    def slow(self) -> list[float]:
        """The cycles that paid for the silent member (more than half a budget over healthy)."""
        limit = statistics.median(self.healthy) + self.budget / 2
        return [t for t in self.silent if t > limit]

    def line(self) -> str:
        healthy = statistics.median(self.healthy) * 1000
        silent = statistics.median(self.silent) * 1000
        return (
            f"sentinel zone partitioned (budget {self.budget * 1000:.0f} ms): median cycle "
            f"{silent:.2f} ms (healthy {healthy:.2f} ms), max {max(self.silent) * 1000:.0f} ms, "
            f"{len(self.slow)} of {len(self.silent)} cycles paid a budget in {self.window:.0f} s"
        )


def silent_zone_cycles(
    cluster: HostCluster, probe: Probe, *, fault: str, budget: float = 0.1, window: float = 4.0
) -> ZoneCycles:
    """Cycles (acquire+release) on a Redlock of the zone and two plain masters, from a client
    host: for a second healthy, then for ``window`` seconds with the zone's host silenced by
    ``fault`` (see ``host_scenarios.FAULTS``)."""
    with sentinel_zone(cluster) as zone:
        nodes = [zone, cluster.masters[1].url, cluster.masters[2].url]
        probe.ask(op="engine", nodes=nodes, node_timeout=budget, mode="sync")
        probe.ask(op="warm")
        healthy: Any = probe.ask(op="cycles", resource="zone", seconds=1.0)["seconds"]
        with silenced(cluster, fault, ["m0"]):
            silent: Any = probe.ask(op="cycles", resource="zone", seconds=window)["seconds"]
        probe.ask(op="close")
    return ZoneCycles(budget, healthy, silent, window)
