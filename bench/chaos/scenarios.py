"""The fault scenarios: real faults on real redis-server processes (5 lock masters), while client
processes do critical sections; then the checkers, plus what each scenario must show besides.

Every scenario starts its own masters (faults must not leak), returns a ``Result`` and never
raises for a violation: a violation is data (the hazard demonstration and the checker self-test
*expect* some). Sizes: ``FULL`` (8 processes x 250 sections) for ``python -m bench.chaos``, ``CI``
(3 x 20) for the test suite.

Time bounds, as in tests/test_engine_faults.py: a failed acquisition attempt is two rounds (SET,
then the clean-up), so with ``wait=W`` the error comes within ``W + 2 * NODE_TIMEOUT + OVERHEAD``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from django_redlock.engine import LockNotAcquired, QuorumUnavailable, Redlock
from django_redlock.testing.clock import clock_shim, shifted_clock_env, step_clock

from .harness import Clients, Cluster, Hold, Outcome, Plan, run

#: Local slack on every time bound: two cores shared with other test runs.
OVERHEAD = 0.25
PROBE = "chaos-probe"  # a resource of the controller's own, for probes beside the clients


@dataclass(frozen=True)
class Size:
    processes: int
    sections: int  # per process

    @property
    def total(self) -> int:
        return self.processes * self.sections


FULL = Size(8, 250)
CI = Size(3, 20)


@dataclass
class Result:
    """One scenario's outcome: the checkers' verdict, the scenario's own checks, notes."""

    name: str
    outcome: Outcome
    checks: dict[str, bool]
    notes: list[str] = field(default_factory=list)
    expect_violations: bool = False

    @property
    def violations(self) -> int:
        return self.outcome.verdict.violations

    @property
    def ok(self) -> bool:
        """As it must be: 0 violations (or some, where a violation is the point) and every
        scenario check held."""
        detected = self.violations > 0
        return detected == self.expect_violations and all(self.checks.values())

    def failed_checks(self) -> list[str]:
        return [name for name, held in self.checks.items() if not held]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[Size, Path], Result]


def plan_for(cluster: Cluster, workdir: Path, size: Size, **options: object) -> Plan:
    return Plan(
        nodes=cluster.nodes,
        counter_url=cluster.counter_url,
        journal_dir=str(workdir / "journal"),
        sections=size.sections,
        **options,  # type: ignore[arg-type]
    )


def budget_for(size: Size, per_section: float = 0.05) -> float:
    """How long a run may take before its clients give up (a hang must not hang the suite)."""
    return 30.0 + size.total * per_section


def finish(
    name: str,
    cluster: Cluster,
    outcome: Outcome,
    plan: Plan,
    *,
    expected_done: int,
    checks: dict[str, bool] | None = None,
    notes: list[str] | None = None,
    expect_violations: bool = False,
) -> Result:
    """Add the checks every scenario shares, and the notes that explain the row."""
    checks = dict(checks or {})
    notes = list(notes or [])
    checks["every section done"] = outcome.done == expected_done
    # Released keys are gone at once; a key a paused or slow master took late lives its TTL.
    left = not cluster.wait_no_lock_keys(plan.ttl + cluster.late_delivery)
    if left:
        # A request that a loaded machine delivered later still (beside two CPU burners: keys
        # with about 0.5 s of their TTL left after the wait) lives its TTL from then. A key
        # kept (without a TTL, or renewed by a client that should be done) outlives a second
        # wait as well.
        left = not cluster.wait_no_lock_keys(plan.ttl + cluster.late_delivery)
    checks["no lock key left after its TTL"] = not left
    if left:  # set late (their TTL runs from then), or kept: which, the TTLs tell
        notes.append(f"lock keys left, PTTL ms: {cluster.lock_key_ttls()}")
    verdict = outcome.verdict
    if verdict.stale_writes:
        notes.append(f"stale writes rejected {verdict.stale_rejected}/{verdict.stale_writes}")
    if outcome.failures:
        kinds = sorted({f.kind for f in outcome.failures})
        notes.append(f"{len(outcome.failures)} acquisitions failed ({', '.join(kinds)})")
    late = outcome.late_counts()
    if late:
        notes.append(f"{late} counter writes finished after validity (scheduling pause)")
    notes.extend(verdict.examples[:2])
    return Result(name, outcome, checks, notes, expect_violations)


def within(outcome: Outcome, start: float, end: float) -> int:
    """Sections acquired between two monotonic instants."""
    return sum(start <= s.acquired < end for s in outcome.sections)


def first_acquired_after(outcome: Outcome, instant: float, not_worker: str) -> float | None:
    times = [
        s.acquired for s in outcome.sections if s.acquired > instant and s.worker != not_worker
    ]
    return min(times) if times else None


@contextlib.contextmanager
def probe_engine(cluster: Cluster, **options: object) -> Iterator[Redlock]:
    engine = Redlock(list(cluster.nodes), **options)  # type: ignore[arg-type]
    try:
        yield engine
    finally:
        engine.close()


def probe_keys(cluster: Cluster, indexes: range | list[int]) -> list[bool]:
    """Whether each of these masters holds the probe's lock key."""
    found = cluster.each_master(lambda c: c.exists(f"redlock:lock:{PROBE}"))
    return [bool(found[i]) for i in indexes]


# --- the scenarios ---


def healthy(size: Size, workdir: Path) -> Result:
    with Cluster(workdir) as cluster:
        plan = plan_for(cluster, workdir, size)
        outcome = run(cluster, plan, size.processes, budget=budget_for(size))
        return finish(
            "healthy", cluster, outcome, plan, expected_done=size.total,
            checks={"no acquisition failed": not outcome.failures},
        )  # fmt: skip


def masters_killed(size: Size, workdir: Path) -> Result:
    with Cluster(workdir) as cluster:

        def faults(clients: Clients) -> None:
            clients.wait_progress(1 / 3)
            cluster.masters[0].kill()
            clients.note("killed master 0")
            clients.wait_progress(2 / 3)
            cluster.masters[1].kill()
            clients.note("killed master 1")

        plan = plan_for(cluster, workdir, size)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        killed_at = [t for t, _ in outcome.events]
        return finish(
            "masters-killed", cluster, outcome, plan, expected_done=size.total,
            checks={
                "sections after the 2nd kill": within(outcome, killed_at[-1], float("inf")) > 0,
            },
            notes=[f"sections with 2 of 5 down: {within(outcome, killed_at[-1], float('inf'))}"],
        )  # fmt: skip


def fault_window(
    clients: Clients, begin: Callable[[], None], end: Callable[[], None], longest: float
) -> tuple[float, float]:
    """Begin a fault at a third of the run; end it at two thirds, or after ``longest`` seconds
    (a slow window costs a budget per round: a full-size run would take minutes)."""
    clients.wait_progress(1 / 3)
    begin()
    began = clients.note("fault begins")
    deadline = began + longest
    while time.monotonic() < deadline and not clients.wait_progress(2 / 3, timeout=0.05):
        pass
    end()
    return began, clients.note("fault ends")


def masters_paused(size: Size, workdir: Path) -> Result:
    node_timeout = 0.02
    with Cluster(workdir) as cluster:
        window: list[float] = []

        def pause() -> None:
            for m in cluster.masters[:2]:
                m.pause()

        def resume() -> None:
            for m in cluster.masters[:2]:
                m.resume()

        def faults(clients: Clients) -> None:
            longest = 4.0 if size.total > CI.total else 1.5
            window.extend(fault_window(clients, pause, resume, longest=longest))

        plan = plan_for(cluster, workdir, size, node_timeout=node_timeout)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size, 0.1))
        during = within(outcome, *window)
        length = window[1] - window[0]
        return finish(
            "masters-paused", cluster, outcome, plan, expected_done=size.total,
            checks={"sections while 2 masters were paused": during > 0},
            notes=[f"{during} sections while 2 of 5 were SIGSTOPped for {length:.1f} s"],
        )  # fmt: skip


def slow_masters(size: Size, workdir: Path) -> Result:
    """Two masters behind a proxy adding 50 ms each way, their script caches flushed; the budget
    is 20 ms. The lock must be won from the other three within the budget, and a release must
    still reach the slow ones."""
    node_timeout, delay = 0.02, 0.05
    with Cluster(workdir, proxied=2) as cluster:
        window: list[float] = []
        probe: dict[str, bool] = {}

        def slow() -> None:
            for proxy in cluster.proxies:
                proxy.delay = delay
            # Cold script caches on the slow masters: a release sent as a bare EVALSHA would be
            # answered NOSCRIPT after the deadline and never resent (fixed in the engine: a
            # master not known to have a script gets its source).
            for master in cluster.masters[:2]:
                client = master.client()
                try:
                    client.script_flush()
                finally:
                    client.close()

        def heal() -> None:
            # While still slow: a probe lock of our own is won in budget, reaches the slow
            # masters late, and its release reaches them too (in order, on the same path).
            with probe_engine(cluster, node_timeout=node_timeout) as engine:
                started = time.monotonic()
                lock = engine.lock(PROBE, ttl=10).acquire()
                took = time.monotonic() - started
                probe["probe won within 3 budgets"] = took < 3 * node_timeout + OVERHEAD
                time.sleep(3 * delay)
                probe["probe key reached the slow masters"] = all(probe_keys(cluster, [0, 1]))
                lock.release()
                time.sleep(3 * delay)
                probe["release reached the slow masters"] = not any(probe_keys(cluster, [0, 1]))
            for proxy in cluster.proxies:
                proxy.delay = 0.0

        def faults(clients: Clients) -> None:
            window.extend(
                fault_window(clients, slow, heal, longest=4.0 if size.total > CI.total else 1.5)
            )

        plan = plan_for(cluster, workdir, size, node_timeout=node_timeout)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size, 0.1))
        during = within(outcome, *window)
        return finish(
            "slow-masters", cluster, outcome, plan, expected_done=size.total,
            checks={"sections while 2 masters were slow": during > 0, **probe},
            notes=[f"{during} sections while 2 of 5 answered after 100 ms (budget 20 ms)"],
        )  # fmt: skip


def replies_past_ttl(size: Size, workdir: Path) -> Result:
    """Three masters (a majority) answer after 0.6 s round trips; ttl 0.5 s, budget 0.8 s (so
    the late grants are read). Every master says yes, too late: no lock may be handed out."""
    ttl, node_timeout, delay = 0.5, 0.8, 0.3
    with Cluster(workdir, proxied=3) as cluster:
        window: list[float] = []

        def faults(clients: Clients) -> None:
            clients.wait_progress(1 / 3)
            for proxy in cluster.proxies:
                proxy.delay = delay
            window.append(clients.note("3 masters delayed past the TTL"))
            # Long enough for several attempts to find the key free and be granted too late
            # (~1 every 0.8 s here): at CI size 2 s gave one, sometimes none.
            time.sleep(3.5)
            for proxy in cluster.proxies:
                proxy.delay = 0.0
            window.append(clients.note("delay removed"))

        # Clients poll (a short wait, tried again and again) rather than sleep in the queues,
        # so that attempts keep meeting the late replies this scenario is about.
        plan = plan_for(
            cluster, workdir, size, ttl=ttl, node_timeout=node_timeout, wait=0.05, retry_delay=0.05
        )
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        # Requests sent just before the delay began still came back quickly: look inside.
        inside = within(outcome, window[0] + 2 * delay + 0.1, window[1])
        too_late = [f for f in outcome.failures if "answered too late" in f.message]
        return finish(
            "replies-past-ttl", cluster, outcome, plan, expected_done=size.total,
            checks={
                "no lock won while replies took longer than the TTL": inside == 0,
                "refused as 'answered too late'": bool(too_late),
            },
            notes=[f"{len(too_late)} attempts refused: granted by all, after the TTL"],
        )  # fmt: skip


def majority_down(size: Size, workdir: Path) -> Result:
    """Three of five masters killed: QuorumUnavailable within its bound, the partial keys of a
    failed attempt removed from the two survivors; the three restart (empty) after the TTL."""
    ttl, node_timeout, wait = 1.0, 0.05, 0.5
    with Cluster(workdir) as cluster:
        probe: dict[str, bool] = {}
        notes: list[str] = []

        def faults(clients: Clients) -> None:
            clients.wait_progress(1 / 3)
            for m in cluster.masters[:3]:
                m.kill()
            down = clients.note("3 of 5 masters killed")
            with probe_engine(cluster, node_timeout=node_timeout) as engine:
                started = time.monotonic()
                try:
                    engine.lock(PROBE, ttl=ttl, wait=0).acquire()
                except QuorumUnavailable:
                    took = time.monotonic() - started
                    probe["probe: QuorumUnavailable"] = True
                    probe["probe: within 2 budgets"] = took < 2 * node_timeout + OVERHEAD
                    notes.append(f"probe refused in {took * 1000:.0f} ms")
                else:
                    probe["probe: QuorumUnavailable"] = False
            probe["probe: partial keys removed"] = not any(probe_keys(cluster, [3, 4]))
            # Restarted empty only after the TTL: no lease they held can still be valid.
            time.sleep(max(0.0, down + ttl + 0.2 - time.monotonic()))
            for m in cluster.masters[:3]:
                m.start()
            clients.note("3 masters restarted empty, after the TTL")

        plan = plan_for(cluster, workdir, size, ttl=ttl, node_timeout=node_timeout, wait=wait)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        unavailable = [f for f in outcome.failures if f.kind == "QuorumUnavailable"]
        slowest = max((f.elapsed - f.wait for f in unavailable), default=0.0)
        notes.append(
            f"{len(unavailable)} QuorumUnavailable, at most {slowest * 1000:.0f} ms past wait"
        )
        return finish(
            "majority-down", cluster, outcome, plan, expected_done=size.total,
            checks={
                **probe,
                "clients saw QuorumUnavailable": bool(unavailable),
                "each within wait + 2 budgets": slowest < 2 * node_timeout + OVERHEAD,
            },
            notes=notes,
        )  # fmt: skip


def holder_paused(size: Size, workdir: Path) -> Result:
    """A client SIGSTOPped while holding (auto-extended, ttl 0.5 s) for twice its TTL: its
    watchdog is stopped too. On resume it must know it lost the lock, and its fenced write must
    be rejected (others wrote with newer tokens meanwhile)."""
    ttl = 0.5
    hold = Hold(0, size.sections // 3, "stop")
    with Cluster(workdir) as cluster:
        paused: dict[str, float] = {}

        def faults(clients: Clients) -> None:
            record = clients.wait_holding(hold.process)
            paused["at"] = clients.note("holder stopped")
            done = clients.done()
            time.sleep(2 * ttl)
            clients.wait_done(done + 1)  # others went on meanwhile
            signal_process(record["pid"], signal.SIGCONT)
            paused["resumed"] = clients.note("holder resumed")

        plan = plan_for(cluster, workdir, size, ttl=ttl, auto_extend=True, hold=hold)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        victim = [s for s in outcome.sections if (s.worker, s.seq) == ("0", hold.seq)]
        section = victim[0] if victim else None
        return finish(
            "holder-paused", cluster, outcome, plan, expected_done=size.total,
            checks={
                "paused holder reported LockLost": section is not None and section.lost,
                "its fenced write was rejected": section is not None and section.fenced is False,
                "it did not write the counter": section is not None and not section.counted,
            },
            notes=[
                f"holder stopped {paused['resumed'] - paused['at']:.1f} s (ttl {ttl} s)",
                *held_notes(outcome, hold),
            ],
        )  # fmt: skip


def held_notes(outcome: Outcome, hold: Hold) -> list[str]:
    """The held section's own note: the counter it read, and what others made of it meanwhile."""
    return [
        f"holder {s.note}"
        for s in outcome.sections
        if (s.worker, s.seq) == (str(hold.process), hold.seq) and s.note
    ]


def signal_process(pid: int, signum: int) -> None:
    os.kill(pid, signum)


def holder_killed(size: Size, workdir: Path) -> Result:
    """A client SIGKILLed while holding: the lock must be free within its TTL."""
    ttl = 1.0
    hold = Hold(0, size.sections // 3, "stop")
    with Cluster(workdir) as cluster:
        killed: dict[str, float] = {}

        def faults(clients: Clients) -> None:
            record = clients.wait_holding(hold.process)
            signal_process(record["pid"], signal.SIGKILL)
            killed["at"] = clients.note("holder killed (SIGKILL)")
            # A probe asks too: the other clients may have finished their sections already (a
            # loaded machine starts the holder's process last), and the lock must be free anyway.
            with probe_engine(cluster, node_timeout=plan.node_timeout) as engine:
                with contextlib.suppress(LockNotAcquired):
                    lock = engine.lock(plan.resource, ttl=ttl, wait=ttl + 2.0).acquire()
                    killed["probe"] = time.monotonic()
                    lock.release()

        plan = plan_for(cluster, workdir, size, ttl=ttl, hold=hold)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        worker = first_acquired_after(outcome, killed["at"], not_worker="0")
        taken = [t for t in (worker, killed.get("probe")) if t is not None]
        gap = min(taken) - killed["at"] if taken else float("inf")
        return finish(
            "holder-killed", cluster, outcome, plan,
            expected_done=size.total - (size.sections - hold.seq),
            checks={
                "free within the TTL": gap < ttl + plan.retry_delay + OVERHEAD,
                "killed (-9)": outcome.exitcodes[0] == -signal.SIGKILL,
            },
            notes=[f"taken over {gap:.2f} s after the kill (ttl {ttl} s)"],
        )  # fmt: skip


def holder_terminated(size: Size, workdir: Path) -> Result:
    """A client sent SIGTERM while holding: its handler raises SystemExit, the ``with`` block
    releases on the way out, and the lock is free at once, long before its TTL."""
    ttl = 5.0
    hold = Hold(0, size.sections // 3, "stop")
    with Cluster(workdir) as cluster:
        resumed: dict[str, float] = {}

        def faults(clients: Clients) -> None:
            record = clients.wait_holding(hold.process)
            signal_process(record["pid"], signal.SIGTERM)  # pending while stopped
            signal_process(record["pid"], signal.SIGCONT)
            resumed["at"] = clients.note("holder sent SIGTERM (and resumed)")

        plan = plan_for(cluster, workdir, size, ttl=ttl, hold=hold)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        taken = first_acquired_after(outcome, resumed["at"], not_worker="0")
        gap = float("inf") if taken is None else taken - resumed["at"]
        terminated = [s for s in outcome.sections if "terminated" in s.note]
        return finish(
            "holder-terminated", cluster, outcome, plan,
            expected_done=size.total - (size.sections - hold.seq),
            checks={
                "free at once (well within the TTL)": gap < 1.0,
                "exited through SystemExit(143)": outcome.exitcodes[0] == 128 + signal.SIGTERM,
                "its section recorded as terminated": len(terminated) == 1,
            },
            notes=[f"taken over {gap * 1000:.0f} ms after SIGTERM (ttl {ttl} s)"],
        )  # fmt: skip


def restarted_master(
    size: Size, workdir: Path, *, delayed: bool, quarantine: bool = False
) -> Result:
    """Masters 3 and 4 crash; a client holds the lock (so on masters 0, 1, 2 only) for 1 s of
    its 1.5 s lease; master 2 crashes too. ``delayed=False``: 2, 3, 4 come back empty at once,
    and the next client wins a majority on them while the first still holds it: the documented
    hazard, which the checkers must report. ``delayed=True``: each crashed master stays down
    until the TTL has passed since its crash, and nothing is violated. ``quarantine=True``: they
    come back at once, but the clients run with quarantine (MAX_TTL = the TTL): the restarted
    masters abstain until no lease they lost can be valid, and nothing is violated."""
    ttl = 1.5
    hold = Hold(0, size.sections // 2, "sleep", seconds=1.0)
    with Cluster(workdir) as cluster:
        crashed: dict[int, float] = {}

        def rejoin(index: int) -> None:
            if delayed:
                time.sleep(max(0.0, crashed[index] + ttl + 0.2 - time.monotonic()))
            cluster.masters[index].start()

        def faults(clients: Clients) -> None:
            clients.wait_progress(1 / 4)
            for i in (3, 4):
                cluster.masters[i].kill()
                crashed[i] = clients.note(f"master {i} crashed")
            clients.wait_holding(hold.process)
            cluster.masters[2].kill()
            crashed[2] = clients.note("master 2 crashed under a holder")
            for i in (2, 3, 4):
                rejoin(i)
            clients.note("masters 2, 3, 4 back, empty" + (" after the TTL" if delayed else ""))

        # Clients poll (a short wait, tried again and again) rather than sleep in the queues:
        # masters that come back empty send no release notice, so a queued waiter would sleep
        # past the window in which the hazard shows.
        plan = plan_for(
            cluster, workdir, size, ttl=ttl, hold=hold, wait=0.05, quarantine=quarantine
        )
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        if quarantine:
            name = "restart-quarantined"
            notes = ["masters rejoined empty at once; quarantined for MAX_TTL: safe"]
        elif delayed:
            name = "restart-delayed"
            notes = ["crashed masters rejoined only after the TTL: safe"]
        else:
            name = "restart-empty-hazard"
            notes = ["HAZARD shown: a master rejoined empty within the TTL; detected as expected"]
        notes += held_notes(outcome, hold)
        return finish(
            name, cluster, outcome, plan, expected_done=size.total,
            notes=notes, expect_violations=not (delayed or quarantine),
        )  # fmt: skip


def sentinel_failover(size: Size, workdir: Path, *, quarantine: bool) -> Result:
    """Three members: masters B (behind a proxy) and A, and a Sentinel member S (a primary and a
    replica whose replication link is behind a proxy too). At a third of the run B is cut off and
    the replica falls far behind (replication is asynchronous); once keys from before have
    expired, the next section holds the lock 1.8 s of its 2 s lease, on A and S only (a bare
    quorum). B comes back, and Sentinel promotes S's replica, which never received that key.
    Without quarantine another client wins B and the new primary while the first still holds
    the lock; with it (MAX_TTL = the TTL) the promoted replica, a new replication id, abstains,
    and nothing is violated."""
    from django_redlock.testing.sentinels import sentinel_group

    ttl, long_work = 2.0, 1.8
    flag = workdir / "long"
    with (
        Cluster(workdir, masters=2, proxied=1) as cluster,
        sentinel_group(workdir / "sentinel", lag=True) as group,
    ):
        replication = group.replication
        assert replication is not None  # noqa: S101

        def faults(clients: Clients) -> None:
            clients.wait_progress(1 / 3)
            cluster.proxies[0].blackhole()
            replication.delay = 60.0
            clients.note("B cut off; the Sentinel member's replica far behind")
            time.sleep(ttl + 0.2)  # (keys B and the replica kept from before: expired)
            flag.touch()
            time.sleep(0.2)  # a section acquires, and holds the lock 1.8 s
            flag.unlink()
            clients.note("a section holds the lock on A and S only")
            cluster.proxies[0].heal()
            new = group.failover()
            clients.note(f"B back; Sentinel promoted the lagging replica (:{new.port})")
            replication.delay = 0.0

        plan = plan_for(
            cluster, workdir, size, ttl=ttl, wait=0.05, quarantine=quarantine,
            long_work=long_work, long_flag=str(flag),
            work=max(0.005, 6.0 / size.total),  # (a run that lasts past the faults, any size)
        )  # fmt: skip
        plan = replace(plan, nodes=(*plan.nodes, group.url))
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        if quarantine:
            name = "sentinel-failover-quarantined"
            notes = ["the promoted replica abstained for MAX_TTL: safe"]
        else:
            name = "sentinel-failover-hazard"
            notes = ["HAZARD shown: a promoted replica lacked a bare-quorum lock; detected"]
        return finish(
            name, cluster, outcome, plan, expected_done=size.total,
            notes=notes, expect_violations=not quarantine,
        )  # fmt: skip


def clock_stepped(size: Size, workdir: Path) -> Result:
    """A client holds the lock (1 s of its 1.5 s lease) when the wall clocks of masters 0, 1 and
    2 step 60 s forward. Redis expires keys by its own wall clock, so the holder's copies vanish
    there and the next client wins a majority while the first still holds it: the documented
    hazard (run masters with a slewing time sync, never stepped), which the checkers must
    report. Monotonic clocks, and the clients', are untouched."""
    hold = Hold(0, size.sections // 2, "sleep", seconds=1.0)
    env = shifted_clock_env(clock_shim(workdir / "shim"))
    with Cluster(workdir, master_env=env) as cluster:

        def faults(clients: Clients) -> None:
            clients.wait_holding(hold.process)
            for master in cluster.masters[:3]:
                step_clock(master, 60.0)
            clients.note("wall clocks of masters 0, 1, 2 stepped 60 s forward under a holder")

        # The other clients poll (short waits, retried at once) rather than sleep in the FIFO
        # queue: a queued waiter looks again only on a notice or its 1 s safety poll, which may
        # fall after the hold, and then the hazard is real but no one is there to show it.
        plan = plan_for(cluster, workdir, size, ttl=1.5, hold=hold, wait=0.05)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        notes = ["HAZARD shown: a majority's wall clocks stepped forward; detected as expected"]
        return finish(
            "clock-step-hazard", cluster, outcome, plan, expected_done=size.total,
            notes=notes + held_notes(outcome, hold), expect_violations=True,
        )  # fmt: skip


def script_flush(size: Size, workdir: Path) -> Result:
    with Cluster(workdir) as cluster:

        def faults(clients: Clients) -> None:
            for fraction in (1 / 4, 1 / 2, 3 / 4):
                clients.wait_progress(fraction)
                cluster.each_master(lambda c: c.script_flush())
                clients.note("SCRIPT FLUSH on every master")

        plan = plan_for(cluster, workdir, size)
        outcome = run(cluster, plan, size.processes, faults, budget=budget_for(size))
        return finish(
            "script-flush", cluster, outcome, plan, expected_done=size.total,
            checks={"no acquisition failed": not outcome.failures},
            notes=["3 x SCRIPT FLUSH on all masters, reloaded transparently"],
        )  # fmt: skip


def fork_after_acquire(size: Size, workdir: Path) -> Result:
    every = max(1, size.sections // 5)
    with Cluster(workdir) as cluster:
        plan = plan_for(cluster, workdir, size, fork_every=every, auto_extend=True, ttl=1.0)
        outcome = run(cluster, plan, size.processes, budget=budget_for(size))
        forks = [s.note for s in outcome.sections if s.note.startswith("fork:")]
        bad = [f for f in forks if not fork_was_clean(f)]
        return finish(
            "fork-after-acquire", cluster, outcome, plan, expected_done=size.total,
            checks={
                "forked inside sections": len(forks) >= size.processes,
                "children neither renewed nor released": not bad,
            },
            notes=[f"{len(forks)} forks while holding; {len(bad)} bad", *bad[:2]],
        )  # fmt: skip


def fork_was_clean(note: str) -> bool:
    """``fork: child exit 0, parent's key on 5 -> 5 masters``: the child exited cleanly (it saw
    no renewal schedule, extend() refused) and the parent's key is on as many masters as before
    (at least a quorum)."""
    words = note.replace(",", "").split()
    code, before, after = int(words[3]), int(words[-4]), int(words[-2])
    return code == 0 and after == before >= 3


def threads_sharing(size: Size, workdir: Path) -> Result:
    with Cluster(workdir) as cluster:
        plan = plan_for(cluster, workdir, size, threads=2, intruder=True)
        outcome = run(cluster, plan, size.processes, budget=budget_for(size))
        refused = sum(i["refused"] for i in outcome.intruders)
        released = sum(i["released"] for i in outcome.intruders)
        expected = max(1, size.sections // 2) * 2 * size.processes
        return finish(
            "threads", cluster, outcome, plan, expected_done=expected,
            checks={
                "intruder tried": refused + released > 0,
                "no thread released another's lock": released == 0,
            },
            notes=[f"2 threads + 1 intruder per process; {refused} foreign releases refused"],
        )  # fmt: skip


def self_test(size: Size, workdir: Path) -> Result:
    """The checkers must be able to fail: the clients run with a quorum of 1 (patched inside
    those processes only), so two of them can hold the lock at once. They try without waiting
    (``wait=0``, again at once), as the other hazards' clients poll: waiters queued in turn are
    handed the lock in order, which makes fence tokens issued out of order too rare to show."""
    with Cluster(workdir) as cluster:
        plan = plan_for(cluster, workdir, size, broken_quorum=True, wait=0.0)
        outcome = run(cluster, plan, size.processes, budget=budget_for(size))
        verdict = outcome.verdict
        return finish(
            "self-test (quorum 1)", cluster, outcome, plan, expected_done=size.total,
            checks={
                "lost updates seen": verdict.lost_updates > 0,
                "overlaps seen": verdict.overlaps > 0,
                "fence violations seen": verdict.fence_violations > 0,
            },
            notes=["deliberately broken: the checkers must trip"],
            expect_violations=True,
        )  # fmt: skip


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in [
        Scenario("healthy", "5 healthy masters", healthy),
        Scenario("masters-killed", "master 0 then master 1 SIGKILLed mid-run", masters_killed),
        Scenario("masters-paused", "2 masters SIGSTOPped mid-run", masters_paused),
        Scenario("slow-masters", "2 masters slower than their budget (proxy)", slow_masters),
        Scenario("replies-past-ttl", "a majority answers after the TTL", replies_past_ttl),
        Scenario("majority-down", "3 of 5 masters killed", majority_down),
        Scenario("holder-paused", "the holder SIGSTOPped past its validity", holder_paused),
        Scenario("holder-killed", "the holder SIGKILLed", holder_killed),
        Scenario("holder-terminated", "the holder sent SIGTERM", holder_terminated),
        Scenario(
            "restart-empty-hazard",
            "a master restarts empty under a holder (documented hazard)",
            lambda size, workdir: restarted_master(size, workdir, delayed=False),
        ),
        Scenario(
            "restart-delayed",
            "the same, restarts delayed past the TTL",
            lambda size, workdir: restarted_master(size, workdir, delayed=True),
        ),
        Scenario(
            "restart-quarantined",
            "the same, restarts at once, clients with quarantine (MAX_TTL = the TTL)",
            lambda size, workdir: restarted_master(size, workdir, delayed=False, quarantine=True),
        ),
        Scenario(
            "sentinel-failover-hazard",
            "a Sentinel member fails over to a lagging replica under a bare-quorum holder",
            lambda size, workdir: sentinel_failover(size, workdir, quarantine=False),
        ),
        Scenario(
            "sentinel-failover-quarantined",
            "the same, clients with quarantine (MAX_TTL = the TTL)",
            lambda size, workdir: sentinel_failover(size, workdir, quarantine=True),
        ),
        Scenario(
            "clock-step-hazard",
            "a majority's wall clocks step forward under a holder (documented hazard)",
            clock_stepped,
        ),
        Scenario("script-flush", "SCRIPT FLUSH on every master mid-run", script_flush),
        Scenario("fork-after-acquire", "os.fork() while holding", fork_after_acquire),
        Scenario("threads", "2 threads per process, one lock object seen by both", threads_sharing),
        Scenario("self-test", "checker self-test: a quorum of 1", self_test),
    ]
}


# --- soak ---


def soak(seconds: float, processes: int, workdir: Path, *, seed: int | None = None) -> Result:
    """Clients work for ``seconds`` while a random fault is injected every 2-4 s, each healed
    before the next. All masters sit behind proxies (no delay unless slowed). Crashed masters
    rejoin empty only after the TTL: the safe operating rule."""
    rng = random.Random(seed)
    ttl, node_timeout = 1.0, 0.02
    counts: dict[str, int] = {}
    with Cluster(workdir, proxied=5) as cluster:

        def crash(indexes: list[int]) -> None:
            for i in indexes:
                cluster.masters[i].kill()
            time.sleep(ttl + 0.2)
            for i in indexes:
                cluster.masters[i].start()

        def pause(indexes: list[int]) -> None:
            for i in indexes:
                cluster.masters[i].pause()
            time.sleep(1.0)
            for i in indexes:
                cluster.masters[i].resume()

        def slow(indexes: list[int]) -> None:
            for i in indexes:
                cluster.proxies[i].delay = 0.05
            time.sleep(1.5)
            for i in indexes:
                cluster.proxies[i].delay = 0.0

        def flush(indexes: list[int]) -> None:
            cluster.each_master(lambda c: c.script_flush())

        kinds: list[tuple[str, Callable[[list[int]], None], int]] = [
            ("kill 1", crash, 1),
            ("kill 2", crash, 2),
            ("majority down", crash, 3),
            ("pause 2", pause, 2),
            ("slow 2", slow, 2),
            ("script flush", flush, 0),
        ]

        def faults(clients: Clients) -> None:
            end = clients.started + seconds
            while time.monotonic() + 4.0 < end:
                time.sleep(rng.uniform(2.0, 4.0))
                name, inject, how_many = rng.choice(kinds)
                victims = rng.sample(range(5), how_many)
                clients.note(f"{name} {victims}")
                inject(victims)
                counts[name] = counts.get(name, 0) + 1

        plan = replace(
            plan_for(cluster, workdir, Size(processes, 0)),
            sections=None,
            ttl=ttl,
            node_timeout=node_timeout,
            wait=2.0,
        )
        outcome = run(cluster, plan, processes, faults, budget=seconds)
        injected = ", ".join(f"{n} x{c}" for n, c in sorted(counts.items()))
        return finish(
            f"soak {seconds:.0f} s", cluster, outcome, plan, expected_done=outcome.done,
            notes=[f"faults: {injected or 'none'}"],
        )  # fmt: skip
