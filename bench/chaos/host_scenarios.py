"""Chaos scenarios with masters on separate hosts (``hosts.py``: network namespaces), judged by
the same checkers as the loopback ones; and the time bounds under a silent partition.

Client processes are spread over two client hosts (process ``i`` on ``c<i % 2>``). The faults are
network faults: no process is killed or paused, and a partition is silent (no RST, no ICMP error
within any budget): a link down at the bridge, a blackhole route for the replies, a client whose
frames to some masters go nowhere, a link that flaps, a bandwidth collapse, a delaying proxy on the
path.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .harness import Clients, Faults, Hold, Outcome, Plan, run
from .hosts import ROOT, HostCluster
from .scenarios import (
    CI,
    OVERHEAD,
    Result,
    Scenario,
    Size,
    budget_for,
    fault_window,
    finish,
    first_acquired_after,
    plan_for,
    within,
)


def is_ci(size: Size) -> bool:
    return size.total <= CI.total


def window_length(size: Size) -> float:
    """How long a mid-run fault lasts at most: short at CI size, longer at full size."""
    return 2.0 if is_ci(size) else 5.0


def work_for(size: Size) -> float:
    """Seconds a section holds the lock. At CI size the 60 sections of a run would otherwise be
    over in a fraction of a second, and so would a fault in the middle third: 40 ms each keeps
    the run (and the fault) going for a few seconds."""
    return 0.04 if is_ci(size) else 0.001


#: How late the engine may tell a holder that its lease was lost, after the validity it last
#: had ran out: the watchdog wakes at that instant, give or take a thread switch on a busy box.
TOLD_SLACK = 0.1


def by_host(cluster: HostCluster, outcome: Outcome, start: float, end: float) -> dict[str, int]:
    """Sections acquired between two instants, by client host."""
    counts = dict.fromkeys(cluster.network.clients, 0)
    for s in outcome.sections:
        if start <= s.acquired < end:
            counts[cluster.host_of(s.worker)] += 1
    return counts


def run_on(
    cluster: HostCluster, plan: Plan, size: Size, faults: Faults, per_section: float = 0.05
) -> Outcome:
    return run(cluster, plan, size.processes, faults, budget=budget_for(size, per_section))


def mid_run_fault(
    name: str,
    cluster: HostCluster,
    size: Size,
    workdir: Path,
    fault: tuple[Callable[[], None], Callable[[], None]],
    check: str,
    describe: Callable[[Outcome, float, float], str],
    **options: Any,
) -> Result:
    """Run the clients with ``fault`` (begin, end) in force from a third to two thirds of the
    run (at most ``window_length``); some sections must be done while it lasts."""
    window: list[float] = []

    def faults(clients: Clients) -> None:
        window.extend(fault_window(clients, *fault, longest=window_length(size)))

    plan = plan_for(cluster, workdir, size, work=work_for(size), **options)
    outcome = run_on(cluster, plan, size, faults, per_section=0.1)
    return finish(
        name, cluster, outcome, plan, expected_done=size.total,
        checks={check: within(outcome, *window) > 0},
        notes=[describe(outcome, *window)],
    )  # fmt: skip


def asymmetric(size: Size, workdir: Path) -> Result:
    """Client host c0 reaches masters 0-2 only, c1 reaches 2-4 only: each sees a majority, and
    the two majorities share master 2. Mutual exclusion must hold across them."""
    with HostCluster(workdir) as cluster:
        net = cluster.network

        def cut() -> None:
            net.cut("c0", ["m3", "m4"])
            net.cut("c1", ["m0", "m1"])

        def describe(outcome: Outcome, start: float, end: float) -> str:
            sides = by_host(cluster, outcome, start, end)
            return (
                f"{end - start:.1f} s with c0 -> m0-m2 and c1 -> m2-m4: sections by c0 "
                f"{sides['c0']}, by c1 {sides['c1']}"
            )

        # A lease's keys written on the other side's masters just before the cut block that
        # side until they expire, so progress within the window is only owed if the TTL is well
        # inside it: with the default TTL (2 s, as long as the CI window) one run in the whole
        # suite saw no section at all in the window.
        return mid_run_fault(
            "hosts-asymmetric", cluster, size, workdir, (cut, net.heal),
            "sections while the majorities differed", describe, ttl=window_length(size) / 4,
        )  # fmt: skip


def minority_extending(size: Size, workdir: Path) -> Result:
    """Masters 3 (link down) and 4 (replies blackholed) are cut off while holders auto-extend
    leases held for twice their TTL: renewals must keep winning on the other three, in time."""
    # The default budget: with 20 ms, a healthy master on a loaded 2-core machine (the whole test
    # suite running) now and then missed it too, and a lease was lost for want of a third vote.
    ttl, node_timeout, long_work = 0.5, 0.05, 1.0
    with HostCluster(workdir) as cluster:
        net = cluster.network
        flag = workdir / "long"
        window: list[float] = []

        def cut() -> None:
            net.link("m3", up=False)
            net.blackhole("m4")
            flag.touch()

        def heal() -> None:
            flag.unlink()
            net.heal()

        def faults(clients: Clients) -> None:
            window.extend(fault_window(clients, cut, heal, longest=window_length(size)))

        plan = plan_for(
            cluster, workdir, size, ttl=ttl, node_timeout=node_timeout, auto_extend=True,
            long_work=long_work, long_flag=str(flag),
        )  # fmt: skip
        outcome = run_on(cluster, plan, size, faults, per_section=0.1)
        long = [
            s for s in outcome.sections
            if window[0] <= s.acquired < window[1] and s.released - s.acquired > 1.5 * ttl
        ]  # fmt: skip
        kept = [s for s in long if not s.lost and s.counted]
        lost = [s for s in outcome.sections if s.lost]
        return finish(
            "hosts-minority-extending", cluster, outcome, plan, expected_done=size.total,
            checks={
                "leases held for 2 TTLs during the partition": bool(long),
                "every one kept by renewals on 3 of 5": len(kept) == len(long),
                "no lease lost": not lost,
            },
            notes=[
                f"{len(kept)}/{len(long)} sections held {long_work} s (ttl {ttl} s) kept their "
                f"lease with 2 of 5 cut off for {window[1] - window[0]:.1f} s"
            ],
        )  # fmt: skip


def majority_healed(size: Size, workdir: Path) -> Result:
    """A holder (auto-extended, ttl 1 s) holds while masters 0, 1 (links down) and 2 (replies
    blackholed) are cut off: it must be told the lease is lost no later than the end of its
    validity, and not write; nobody may win the lock meanwhile; after the heal, waiters get it."""
    ttl, node_timeout = 1.0, 0.05
    hold = Hold(0, size.sections // 3, "sleep", seconds=2.5 * ttl)
    with HostCluster(workdir) as cluster:
        net = cluster.network
        at: dict[str, float] = {}

        def faults(clients: Clients) -> None:
            clients.wait_holding(hold.process)
            net.link("m0", up=False)
            net.link("m1", up=False)
            net.blackhole("m2")
            at["cut"] = clients.note("masters 0, 1, 2 cut off under a holder")
            time.sleep(2 * ttl)
            at["healed"] = clients.note("healing")  # clients may win before heal() returns
            net.heal()

        plan = plan_for(
            cluster, workdir, size, ttl=ttl, node_timeout=node_timeout, auto_extend=True,
            wait=3.0, hold=hold,
        )  # fmt: skip
        outcome = run_on(cluster, plan, size, faults)
        held = [s for s in outcome.sections if (s.worker, s.seq) == ("0", hold.seq)]
        told = outcome.told[0] if outcome.told else {}
        lost_at, valid_until = told.get("lost_at"), told.get("valid_until", 0.0)
        late = None if lost_at is None else lost_at - valid_until
        # Requests sent just before the cut may still win: look from one budget after it.
        inside = within(outcome, at["cut"] + node_timeout, at["healed"])
        taken = first_acquired_after(outcome, at["healed"], not_worker="0")
        after = float("inf") if taken is None else taken - at["healed"]
        return finish(
            "hosts-majority-healed", cluster, outcome, plan, expected_done=size.total,
            checks={
                "holder reported LockLost": bool(held) and held[0].lost,
                "told (on_lost) as its validity ended": late is not None and late < TOLD_SLACK,
                "holder did not write the counter": bool(held) and not held[0].counted,
                "nobody won the lock while the majority was cut off": inside == 0,
                "a waiter got it after the heal": after < ttl + OVERHEAD,
            },
            notes=[
                "holder told "
                + ("never" if late is None else f"{late * 1000:+.0f} ms after its validity ended"),
                f"first section {after * 1000:.0f} ms after the heal",
            ],
        )  # fmt: skip


def flapping(size: Size, workdir: Path) -> Result:
    """Links of masters 0 and 1 flap (down 30-70 % of every 300 ms), and client host c1's link
    every 700 ms, for the whole run: at full size a 60 s soak, at CI size a few seconds."""
    seconds = 4.0 if is_ci(size) else 60.0
    with HostCluster(workdir) as cluster:
        net = cluster.network

        def faults(clients: Clients) -> None:
            net.flap(["m0", "m1"], period=0.3, seed=1)
            net.flap(["c1"], period=0.7, seed=2)
            clients.note("flapping")
            end = clients.started + seconds
            while time.monotonic() < end and any(p.is_alive() for p in clients.procs):
                time.sleep(0.05)
            net.heal()
            clients.note("links steady")

        plan = replace(
            plan_for(cluster, workdir, Size(size.processes, 0)),
            sections=None, ttl=0.5, node_timeout=0.02, wait=2.0,
        )  # fmt: skip
        outcome = run(cluster, plan, size.processes, faults, budget=seconds)
        sides = by_host(cluster, outcome, 0.0, float("inf"))
        return finish(
            f"hosts-flapping {seconds:.0f} s", cluster, outcome, plan,
            expected_done=outcome.done,
            checks={"sections on both client hosts": all(sides.values())},
            notes=[f"sections by c0 {sides['c0']}, by c1 (its own link flapping) {sides['c1']}"],
        )  # fmt: skip


def slow_link(size: Size, workdir: Path) -> Result:
    """Master 0's link collapses to 16 kbit/s both ways (``tc tbf``; what does not fit in 200 ms
    of queue is dropped); budget 20 ms. The lock is won on the others meanwhile."""
    with HostCluster(workdir) as cluster:
        net = cluster.network
        return mid_run_fault(
            "hosts-slow-link", cluster, size, workdir,
            (lambda: net.throttle("m0"), lambda: net.unthrottle("m0")),
            "sections while the link was collapsed",
            lambda outcome, start, end: (
                f"{within(outcome, start, end)} sections in {end - start:.1f} s at 16 kbit/s "
                f"on m0"
            ),
            node_timeout=0.02,
        )  # fmt: skip


def delayed_path(size: Size, workdir: Path) -> Result:
    """Masters 0 and 1 reached through a proxy on their own host that holds every chunk 50 ms
    each way (no netem here); budget 20 ms: outvoted, and still released (no key outlives its
    TTL)."""
    with HostCluster(workdir, proxied=2) as cluster:

        def slow(seconds: float) -> None:
            for proxy in cluster.proxies:
                proxy.delay = seconds

        return mid_run_fault(
            "hosts-delayed-path", cluster, size, workdir,
            (lambda: slow(0.05), lambda: slow(0.0)),
            "sections while 2 paths were slow",
            lambda outcome, start, end: (
                f"{within(outcome, start, end)} sections while m0, m1 answered after 100 ms "
                f"(budget 20 ms)"
            ),
            node_timeout=0.02,
        )  # fmt: skip


HOST_SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("hosts-asymmetric", "c0 reaches m0-m2, c1 reaches m2-m4", asymmetric),
        Scenario(
            "hosts-minority-extending",
            "2 masters cut off while leases are auto-extended",
            minority_extending,
        ),
        Scenario(
            "hosts-majority-healed",
            "3 masters cut off under a holder, then healed",
            majority_healed,
        ),  # fmt: skip
        Scenario("hosts-flapping", "2 master links and a client link flapping", flapping),
        Scenario("hosts-slow-link", "a master's bandwidth collapses (tc tbf)", slow_link),
        Scenario("hosts-delayed-path", "2 masters behind a delaying proxy", delayed_path),
    ]
}


# --- time bounds under a silent partition ---

#: The budgets of the timed operations (the default NODE_TIMEOUT of the settings).
NODE_TIMEOUT = 0.05
#: What an acquisition is given to wait.
WAIT = 0.5
#: One operation's own budget: at most two rounds (a failed attempt: the SET, then the clean-up).
BUDGET = 2 * NODE_TIMEOUT

FAULTS = {
    "link down": "the master's link at the bridge is down: both ways",
    "replies blackholed": "a blackhole route on the master: requests land, replies are dropped",
    "cut by the client": "the client's frames to the master go nowhere",
}


class Probe:
    """A timing client in a client host's namespace (``inside.py probe``), driven from here."""

    def __init__(self, cluster: HostCluster, host: str = "c0") -> None:
        self.proc = subprocess.Popen(  # noqa: S603 (our own module, fixed arguments)
            [
                *cluster.network.exec_prefix(host),
                sys.executable,
                "-m",
                "bench.chaos.inside",
                "probe",
            ],  # fmt: skip
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self._read()

    def _read(self) -> str:
        assert self.proc.stdout is not None
        assert self.proc.stderr is not None
        line = self.proc.stdout.readline()
        if not line:
            error = self.proc.stderr.read()[-2000:]
            self.close()
            raise RuntimeError(f"the probe ended: {error}")
        return line

    def ask(self, **command: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self._read())
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@dataclass(frozen=True)
class Timing:
    fault: str
    connection: str  # "open before" (connected before the partition) or "new"
    mode: str  # "sync" or "async"
    silent: int  # masters partitioned
    op: str
    seconds: float
    bound: float
    error: str | None
    #: What the operation may end with: "ok", or the name of the error it raises.
    expected: tuple[str, ...]

    @property
    def outcome(self) -> str:
        return "ok" if self.error is None else self.error.split(":")[0]

    @property
    def ok(self) -> bool:
        return self.seconds <= self.bound and self.outcome in self.expected


@contextlib.contextmanager
def silenced(cluster: HostCluster, fault: str, masters: list[str]) -> Iterator[None]:
    net = cluster.network
    for master in masters:
        if fault == "link down":
            net.link(master, up=False)
        elif fault == "replies blackholed":
            net.blackhole(master)
    if fault == "cut by the client":
        net.cut("c0", masters)
    try:
        yield
    finally:
        net.heal()


def silent_partition_timings(
    cluster: HostCluster, probe: Probe, *, fault: str, connection: str, mode: str
) -> list[Timing]:
    """Time acquire, extend and release while one master is silently partitioned, then an
    acquisition and a held lock's extension and release while a majority is; with connections
    opened before the partition, or none yet (a new connection must be made to a master that
    never answers the SYN)."""
    timings: list[Timing] = []

    def timed(silent: int, op: str, bound: float, *expected: str, **args: Any) -> dict[str, Any]:
        answer = probe.ask(op=op, **args)
        timings.append(
            Timing(
                fault,
                connection,
                mode,
                silent,
                op,
                answer["seconds"],
                bound,
                answer["error"],
                expected,
            )  # fmt: skip
        )
        return answer

    def fresh() -> None:
        cluster.each_master(lambda c: c.flushall())
        probe.ask(op="engine", nodes=list(cluster.nodes), node_timeout=NODE_TIMEOUT, mode=mode)
        if connection == "open before":
            probe.ask(op="warm")

    masters = cluster.network.masters
    fresh()
    with silenced(cluster, fault, masters[:1]):
        timed(1, "acquire", WAIT + BUDGET + OVERHEAD, "ok", resource="one", ttl=5.0, wait=WAIT)
        timed(1, "extend", BUDGET + OVERHEAD, "ok")
        timed(1, "release", BUDGET + OVERHEAD, "ok")
    fresh()
    with silenced(cluster, fault, masters[:3]):
        timed(3, "acquire", WAIT + BUDGET + OVERHEAD, "QuorumUnavailable", resource="three",
              ttl=5.0, wait=WAIT)  # fmt: skip
    ttl = 1.0
    held = probe.ask(op="acquire", resource="held", ttl=ttl, wait=3.0)  # setup, not timed
    assert held["error"] is None, held
    with silenced(cluster, fault, masters[:3]):
        # Extending retries until renewed or the lease runs out: its bound is the validity.
        timed(3, "extend", held["validity"] + BUDGET + OVERHEAD, "LockLost")
        # The engine releases what it can and does not say whether a quorum confirmed it.
        timed(3, "release", BUDGET + OVERHEAD, "ok", "LockLost")
    return timings


def timings_table(timings: list[Timing]) -> str:
    from bench import report

    rows = [
        [t.fault, t.connection, t.mode, f"{t.silent} of 5", t.op, f"{t.seconds * 1000:.0f} ms",
         f"{t.bound * 1000:.0f} ms", t.outcome if t.ok else f"FAILED ({t.error or 'no error'})"]
        for t in timings
    ]  # fmt: skip
    headers = ["partition", "connection", "API", "silent", "operation", "took", "bound", "result"]
    return report.table(headers, rows)


def all_silent_partition_timings(workdir: Path) -> list[Timing]:
    timings: list[Timing] = []
    with HostCluster(workdir, clients=1) as cluster:
        for mode in ("sync", "async"):
            probe = Probe(cluster)
            try:
                for fault in FAULTS:
                    for connection in ("open before", "new"):
                        timings += silent_partition_timings(
                            cluster, probe, fault=fault, connection=connection, mode=mode
                        )
            finally:
                probe.close()
    return timings
