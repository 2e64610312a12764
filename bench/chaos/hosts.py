"""Masters on separate hosts: each master and each group of clients in a network namespace of its
own, joined by veth pairs to one bridge, so that faults are real network faults: a link that goes
down or flaps, a route that swallows replies, a client that reaches a different majority than
another, a link whose bandwidth collapses (``tc tbf``), a path delayed by a proxy.

Topology (every interface, address and route lives inside namespaces this module creates; the
root namespace gains nothing but the namespace names, and its interfaces and routes are never
touched)::

    <run>-hub   bridge br0 (no address), one veth end per host: m0..m4, c0, c1, ...
    <run>-m<i>  eth0 10.213.0.<11+i>/24: redis-server on :6379 (its loopback too, for a proxy)
    <run>-c<j>  eth0 10.213.0.<101+j>/24: client processes

The controller (the test or the bench, in the root namespace) never routes into the private range:
it reaches each master over a unix socket (out of band, like a management network, so no network
fault touches its observations), and so do the clients for the counter and the fenced store, which
are not lock masters and must not be hit by a lock fault. Client processes run inside their
namespace: ``ip netns exec <ns> python ...`` (see ``HostCluster.placed``).

Clean-up: every run has a name of its own, ``rlnet-<pid>-<process start>-<n>``, and removes
everything it made on exit (processes first, then namespaces, which takes their links along),
also on an error or an interrupt. A run killed too hard to clean up (SIGKILL) leaves namespaces
whose owner is gone: the next run sweeps those first (``sweep_leftovers``), and never a live
run's.

It needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), ``ip`` and ``tc`` (iproute2), and a kernel with
network namespaces, veth, bridges and the tbf qdisc. Where namespaces cannot be made,
``HostsUnavailable`` says why: the tests fail with it, never skip.

Why in bench/ and not in ``django_redlock.testing``: it changes the machine's state as root and
needs iproute2 and Linux; that is for our CI and development machines, not a tool to ship to every
project that tests its own locked views (``local_masters`` and ``DelayProxy`` are).
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing.resource_tracker
import multiprocessing.spawn
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

import redis

from django_redlock.testing.masters import LocalMaster

from .harness import Cluster

FAMILY = "rlnet"
SUBNET = "10.213.0"
PREFIX_LENGTH = 24
#: Every client address is in this block (101..126), every master outside it: one blackhole
#: route on a master swallows its replies to all clients.
CLIENT_BLOCK = f"{SUBNET}.64/26"
REDIS_PORT = 6379
PROXY_PORT = 6380
#: A MAC address no interface has: a client whose neighbour entry for a master points there
#: sends into the bridge and nobody receives (a silent, one-sided cut: no error, no RST).
NOWHERE = "02:00:00:00:00:00"
ROOT = Path(__file__).resolve().parents[2]  # the checkout: what ``python -m bench...`` needs
#: Where a run keeps its unix sockets (short paths: at most 107 bytes) and client launchers.
RUNTIME = Path(tempfile.gettempdir())

_runs = itertools.count()


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, no kernel support)."""


def ip_tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if found is None:
        raise HostsUnavailable(f"`{name}` (iproute2) not found: apt-get install -y iproute2")
    return found


def require_root() -> None:
    """Raise ``HostsUnavailable``, saying why, unless this process can make namespaces."""
    if os.geteuid() != 0:
        raise HostsUnavailable(
            f"network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN); this runs as uid "
            f"{os.geteuid()}: run the separate-hosts tests as root (CI does)"
        )
    ip_tool("ip")
    ip_tool("tc")


def run(*command: str, check: bool = True) -> str:
    """Run ``ip``/``tc``/``kill`` style commands; an error carries their stderr."""
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def ip(*args: str, check: bool = True) -> str:
    return run(ip_tool("ip"), *args, check=check)


def tc(*args: str, check: bool = True) -> str:
    return run(ip_tool("tc"), *args, check=check)


def process_start(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), or None if no such process: with the pid,
    an identity that a reused pid does not share."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def remove_namespace(name: str) -> None:
    """Kill every process inside, then delete the namespace (its interfaces go with it)."""
    for pid in ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", name, check=False)


def orphaned(name: str) -> bool:
    """True if ``name`` belongs to a run whose process is gone."""
    match = re.match(rf"{FAMILY}-(\d+)-(\d+)-\d+(-|$)", name)
    return match is not None and process_start(int(match[1])) != match[2]


def sweep_leftovers() -> list[str]:
    """Remove the namespaces and runtime directories of runs whose process is gone (killed
    before it could clean up). A live run's are never touched."""
    removed = [name for name in namespaces() if orphaned(name)]
    for name in removed:
        remove_namespace(name)
    for path in RUNTIME.glob(f"{FAMILY}-*"):
        if orphaned(path.name):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


class Network:
    """The namespaces, the bridge and the links of one run, and the faults on them.

    Hosts are named ``m0``.. (masters) and ``c0``.. (clients). Every fault has its undo, and
    ``heal()`` undoes whatever is in force."""

    def __init__(self, masters: int = 5, clients: int = 2) -> None:
        if masters > 50 or clients > 25:
            raise ValueError("at most 50 masters and 25 client hosts")
        self.masters = [f"m{i}" for i in range(masters)]
        self.clients = [f"c{j}" for j in range(clients)]
        pid = os.getpid()
        self.run = f"{FAMILY}-{pid}-{process_start(pid)}-{next(_runs)}"
        self.hub = f"{self.run}-hub"
        self.made: list[str] = []
        self.throttled: set[str] = set()
        self.blackholed: set[str] = set()
        self._flappers: list[threading.Thread] = []
        self._stop_flapping = threading.Event()

    def ns(self, host: str) -> str:
        return f"{self.run}-{host}"

    def address(self, host: str) -> str:
        kind, index = host[0], int(host[1:])
        return f"{SUBNET}.{(11 if kind == 'm' else 101) + index}"

    def exec_prefix(self, host: str) -> list[str]:
        """Prefix of a command line that runs inside ``host``'s namespace."""
        return [ip_tool("ip"), "netns", "exec", self.ns(host)]

    @property
    def hosts(self) -> list[str]:
        return self.masters + self.clients

    # --- making and removing ---------------------------------------------------------------------

    def up(self) -> Network:
        """Make the namespaces, bridge and links. On any error, remove what was made and raise
        ``HostsUnavailable`` when the cause is that namespaces cannot be made here."""
        require_root()
        sweep_leftovers()
        try:
            self._add(self.hub)
        except RuntimeError as exc:
            raise HostsUnavailable(f"cannot create a network namespace: {exc}") from exc
        try:
            ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
            ip("-n", self.hub, "link", "set", "br0", "up")
            for host in self.hosts:
                ns = self._add(self.ns(host))
                port = f"v{host}"
                ip("-n", self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                   "netns", ns)  # fmt: skip
                ip("-n", self.hub, "link", "set", port, "master", "br0", "up")
                ip("-n", ns, "link", "set", "lo", "up")
                ip("-n", ns, "addr", "add", f"{self.address(host)}/{PREFIX_LENGTH}", "dev", "eth0")
                ip("-n", ns, "link", "set", "eth0", "up")
        except BaseException:
            self.down()
            raise
        return self

    def _add(self, name: str) -> str:
        ip("netns", "add", name)
        self.made.append(name)
        return name

    def down(self) -> None:
        """Remove everything this run made (idempotent; processes inside are killed)."""
        self.stop_flapping()
        for name in reversed(self.made):
            remove_namespace(name)
        self.made.clear()

    def __enter__(self) -> Network:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    # --- faults ----------------------------------------------------------------------------------

    def link(self, host: str, up: bool) -> None:
        """Set the host's link at the bridge up or down. Down: a silent partition of that host,
        both ways (frames to it are dropped at the bridge, its own go nowhere)."""
        ip("-n", self.hub, "link", "set", f"v{host}", "up" if up else "down")

    def blackhole(self, master: str, on: bool = True) -> None:
        """A blackhole route on ``master`` for every client address: requests still arrive and
        are carried out (a SET lands), but every reply, and the SYN-ACK of a new connection, is
        dropped. Silent for the client: no RST, no ICMP."""
        verb = "add" if on else "del"
        ip("-n", self.ns(master), "route", verb, "blackhole", CLIENT_BLOCK, check=on)
        (self.blackholed.add if on else self.blackholed.discard)(master)

    def cut(self, client: str, masters: Iterable[str]) -> None:
        """``client`` no longer reaches ``masters`` (an asymmetric partition: other clients
        still do). Its neighbour entries for them point at a MAC nobody has: frames leave and
        vanish, with no error to the sender."""
        for master in masters:
            ip("-n", self.ns(client), "neigh", "replace", self.address(master), "lladdr",
               NOWHERE, "dev", "eth0", "nud", "permanent")  # fmt: skip

    def uncut(self, client: str) -> None:
        """Undo every ``cut`` of ``client``: neighbours are learnt again by ARP."""
        for master in self.masters:
            ip("-n", self.ns(client), "neigh", "del", self.address(master), "dev", "eth0",
               check=False)  # fmt: skip

    def throttle(self, host: str, rate: str = "16kbit", burst: str = "2kb", latency: str = "200ms"):
        """A bandwidth collapse on ``host``'s link, both ways (``tc tbf``): what does not fit
        in ``latency`` worth of queue is dropped, and TCP retransmits it."""
        for ns, dev in ((self.hub, f"v{host}"), (self.ns(host), "eth0")):
            tc("-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst",
               burst, "latency", latency)  # fmt: skip
        self.throttled.add(host)

    def unthrottle(self, host: str) -> None:
        for ns, dev in ((self.hub, f"v{host}"), (self.ns(host), "eth0")):
            tc("-n", ns, "qdisc", "del", "dev", dev, "root", check=False)
        self.throttled.discard(host)

    def flap(self, hosts: Iterable[str], period: float = 0.3, seed: int | None = None) -> None:
        """Each host's link goes down and up again, over and over: down for a random 30-70 % of
        each ``period`` (so the links do not move in step), until ``stop_flapping()``."""
        rng = random.Random(seed)
        self._stop_flapping.clear()
        for host in hosts:
            thread = threading.Thread(
                target=self._flapping, args=(host, period, rng.random()), daemon=True
            )
            self._flappers.append(thread)
            thread.start()

    def _flapping(self, host: str, period: float, phase: float) -> None:
        rng = random.Random(phase)
        if self._stop_flapping.wait(phase * period):
            return
        while True:
            down = period * rng.uniform(0.3, 0.7)
            self.link(host, up=False)
            stopping = self._stop_flapping.wait(down)
            self.link(host, up=True)
            if stopping or self._stop_flapping.wait(period - down):
                return

    def stop_flapping(self) -> None:
        self._stop_flapping.set()
        for thread in self._flappers:
            thread.join()
        self._flappers.clear()

    def heal(self) -> None:
        """Undo every fault in force: links up, no blackhole, no cut, no throttle."""
        self.stop_flapping()
        for host in self.hosts:
            self.link(host, up=True)
        for master in list(self.blackholed):
            self.blackhole(master, on=False)
        for client in self.clients:
            self.uncut(client)
        for host in list(self.throttled):
            self.unthrottle(host)


class HostMaster(LocalMaster):
    """A redis-server in its own namespace: clients reach it at ``url`` (its address on the
    bridge); the controller, at a unix socket that no network fault touches."""

    def __init__(self, workdir: Path, network: Network, host: str, socket: Path) -> None:
        super().__init__(workdir, REDIS_PORT)
        self.network = network
        self.host = host
        self.address = network.address(host)
        self.socket = socket

    @property
    def url(self) -> str:
        return f"redis://{self.address}:{self.port}/0"

    def command(self) -> list[str]:
        # ``ip netns exec`` execs redis-server in place: ``proc`` is the server itself, and
        # kill/pause/resume signal it directly.
        return [
            *self.network.exec_prefix(self.host),
            *super().command(),
            "--bind", self.address, "127.0.0.1",  # (two arguments: Redis 6.2 and 7 alike)
            "--protected-mode", "no",  # reached from other hosts; a private range, in namespaces
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
        ]  # fmt: skip

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=5, **kwargs)  # type: ignore[arg-type]


class HostProxy:
    """A ``DelayProxy`` inside a master's namespace, on that host's address (``PROXY_PORT``),
    forwarding to the master over the host's loopback: the delayed path of a slow network.
    Driven over its stdin; ``delay`` is settable like a ``DelayProxy``'s."""

    def __init__(self, network: Network, master: HostMaster) -> None:
        self.url = f"redis://{master.address}:{PROXY_PORT}/0"
        self._delay = 0.0
        self.proc = subprocess.Popen(  # noqa: S603 (our own module, fixed arguments)
            [
                *network.exec_prefix(master.host),
                sys.executable,
                "-m",
                "bench.chaos.inside",
                "proxy",
                master.address,
                str(PROXY_PORT),
                str(REDIS_PORT),
            ],  # fmt: skip
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self._expect("ready")

    def _expect(self, word: str) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != word:
            self.stop()
            raise RuntimeError(f"proxy in a namespace said {line!r}, not {word!r}")

    @property
    def delay(self) -> float:
        return self._delay

    @delay.setter
    def delay(self, seconds: float) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"delay {seconds}\n")
        self.proc.stdin.flush()
        self._expect("ok")
        self._delay = seconds

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def python_in(network: Network, host: str, directory: Path) -> Path:
    """A tiny executable that runs this Python inside ``host``'s namespace with the arguments it
    is given: what multiprocessing spawns instead of ``sys.executable``."""
    path = directory / f"python-{host}"
    command = " ".join([*network.exec_prefix(host), sys.executable])
    path.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
    path.chmod(0o700)
    return path


@contextlib.contextmanager
def spawning_with(executable: Path) -> Iterator[None]:
    """Processes started (spawn) inside this block run ``executable`` instead of this Python."""
    # The resource tracker is started by the first spawn if it is not running: start it here,
    # with the plain Python, so that it never lands in a namespace.
    multiprocessing.resource_tracker.ensure_running()
    before = multiprocessing.spawn.get_executable()
    multiprocessing.spawn.set_executable(str(executable))
    try:
        yield
    finally:
        multiprocessing.spawn.set_executable(before)


class HostCluster(Cluster):
    """A ``Cluster`` (for the chaos harness) whose masters and clients are on separate hosts.

    Client process ``i`` runs on client host ``c<i % clients>``. ``network`` makes the faults.
    The first ``proxied`` masters are reached through a ``HostProxy`` on their own host."""

    #: A link that was down holds the frames TCP sent meanwhile, on connections the client may
    #: since have closed (the kernel keeps retransmitting an orphaned socket's data): they arrive
    #: at the next retransmission after the heal, with the RTO doubled per try (0.2, 0.4, 0.8,
    #: 1.6, 3.2 s), so a SET sent during a 2 s cut can land up to ~3 s later and live its TTL.
    #: Seen in CI: a key present 1.5 s after a run whose cut had healed just before it ended.
    #: A link that flaps for seconds (``flapping``: down 30-70 % of every 0.3-0.7 s) can make
    #: five tries in a row miss it, and the sixth comes 6.4 s after the fifth: seen in CI once
    #: in about ten runs of the flapping scenario with 5 s here.
    late_delivery = 13.0

    def __init__(
        self, workdir: Path, *, masters: int = 5, clients: int = 2, proxied: int = 0
    ) -> None:
        super().__init__(workdir, masters=masters, proxied=proxied)
        self.network = Network(masters, clients)
        self.runtime = Path()
        self._pythons: list[Path] = []

    def __enter__(self) -> HostCluster:
        stack = self._stack
        try:
            stack.enter_context(self.network)  # sweeps leftovers first
            # Unix socket paths must be short: not under a test's deep tmp_path.
            self.runtime = RUNTIME / self.network.run
            self.runtime.mkdir(mode=0o700)
            stack.callback(shutil.rmtree, self.runtime, ignore_errors=True)
            for host in self.network.masters:
                master = HostMaster(
                    self.workdir / "masters" / host, self.network, host, self.runtime / host
                )
                stack.callback(master.stop)
                self.masters.append(master.start())
            counter = LocalMaster(
                self.workdir / "counter", None, "--unixsocket", str(self.runtime / "counter")
            )
            stack.callback(counter.stop)
            self.counter = counter.start()
            for master in self.masters[: self._proxied]:
                assert isinstance(master, HostMaster)
                proxy = HostProxy(self.network, master)
                stack.callback(proxy.stop)
                self.proxies.append(proxy)  # type: ignore[arg-type]
            self._pythons = [
                python_in(self.network, host, self.runtime) for host in self.network.clients
            ]
        except BaseException:
            stack.close()
            raise
        return self

    @property
    def counter_url(self) -> str:
        return f"unix://{self.runtime / 'counter'}"

    def client_host(self, index: int) -> str:
        return self.network.clients[index % len(self.network.clients)]

    def placed(self, index: int) -> contextlib.AbstractContextManager[None]:
        return spawning_with(self._pythons[index % len(self._pythons)])

    def host_of(self, worker: str) -> str:
        """The client host of a worker name ("2" or "2/0")."""
        return self.client_host(int(worker.split("/")[0]))

    def master(self, index: int) -> str:
        return self.network.masters[index]
