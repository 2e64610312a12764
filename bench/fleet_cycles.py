"""Scenario (i): the fleet of client processes. P processes (P = 1, 2, 4, 8, 16, 32), each
acquiring and releasing keys of its own through our engine (one attempt each, never contended)
for a fixed time, on 5 local masters; the steps run in rounds, the second in the reverse order.

Per step: total cycles per second (all processes, first ``go`` to last report); the masters'
CPU per cycle, two ways: ``INFO commandstats`` (the commands' own execution time, ``usec``,
summed over the masters and commands) and ``INFO cpu`` (``used_cpu_sys + used_cpu_user``
deltas summed over the masters: the commands, reading and writing sockets, everything the
server did); the busiest master's CPU as a share of one core (a Redis master runs its commands
on one thread: at 1.0 it is saturated); the clients' CPU (their ``process_time`` over the wall
time, in cores) and how busy the machine's CPUs were.

Not to be confused with ``bench/fleet.py`` (jobs and tasks across hosts).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django_redlock.testing.masters import LocalMaster, local_masters

from . import report
from .handoff import uptime
from .remote import spawned

STEPS = (1, 2, 4, 8, 16, 32)
DURATION = 3.0
MASTERS = 5
#: A step's workers that have not reported this long after ``go`` are stuck.
DEADLINE = 120.0
#: The commands a lock cycle sends (the acquire's SET, the release script by SHA, or with its
#: source when the engine does not know the master has it). Only these: the commands a script
#: runs inside (GET, DEL, ZPOPMIN) are counted by commandstats too, and are already in its time.
CYCLE_COMMANDS = ("set", "evalsha", "eval")


@dataclass
class Step:
    processes: int
    cycles_per_s: list[float] = field(default_factory=list)
    cycles: int = 0
    failed: int = 0
    first_error: str = ""
    wall_s: float = 0.0
    command_usec: float = 0.0
    #: Releases sent as EVAL with the script's source, and all releases (EVAL + EVALSHA).
    evals: int = 0
    releases: int = 0
    server_cpu_s: float = 0.0
    busiest_master: list[float] = field(default_factory=list)
    client_cores: list[float] = field(default_factory=list)
    machine_busy: list[float] = field(default_factory=list)


def command_stats(masters: Sequence[LocalMaster]) -> dict[str, tuple[int, float]]:
    """Calls and microseconds of each of ``CYCLE_COMMANDS`` since the last reset, summed over
    the masters."""
    total = dict.fromkeys(CYCLE_COMMANDS, (0, 0.0))
    for master in masters:
        client = master.client()
        try:
            for name, stats in client.info("commandstats").items():
                command = name.removeprefix("cmdstat_")
                if command in total:
                    calls, usec = total[command]
                    total[command] = (calls + int(stats["calls"]), usec + float(stats["usec"]))
        finally:
            client.close()
    return total


def server_cpu(masters: Sequence[LocalMaster]) -> list[float]:
    """Each master's CPU seconds so far (``used_cpu_sys + used_cpu_user``)."""
    seconds = []
    for master in masters:
        client = master.client()
        try:
            info = client.info("cpu")
            seconds.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
        finally:
            client.close()
    return seconds


def reset(masters: Sequence[LocalMaster]) -> None:
    for master in masters:
        client = master.client()
        try:
            client.config_resetstat()
            client.flushall()  # the last step's keys are released; their queues expired
        finally:
            client.close()


def machine_busy(before: list[int], after: list[int]) -> float:
    if len(before) < 8 or len(after) < 8:
        return math.nan
    delta = [b - a for a, b in zip(before, after, strict=True)]
    return (sum(delta) - delta[3] - delta[4]) / (sum(delta) or 1)


def one_step(masters: Sequence[LocalMaster], step: Step, duration: float, tag: str) -> None:
    config = {
        "urls": [m.url for m in masters],
        "ttl": 10.0,
        "duration": duration,
        "prefix": f"bench:fleet:{tag}:",
    }
    with spawned("fleet", "ours", config, step.processes, DEADLINE) as workers:
        for proc in workers:
            assert proc.stdout is not None
            if not json.loads(proc.stdout.readline() or "{}").get("ready"):
                step.first_error = step.first_error or f"a worker did not start ({proc.poll()})"
                return
        reset(masters)
        cpu_before = server_cpu(masters)
        machine_before = report.cpu_times()
        for proc in workers:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = []
        for proc in workers:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line:
                reports.append(json.loads(line))
            else:
                step.first_error = step.first_error or f"a worker died ({proc.poll()})"
        machine_after = report.cpu_times()
        cpu_after = server_cpu(masters)
        stats = command_stats(masters)
    if not reports:
        return
    wall = (max(r["end"] for r in reports) - min(r["start"] for r in reports)) / 1e9
    cycles = sum(r["cycles"] for r in reports)
    step.cycles += cycles
    step.failed += sum(r["failed"] for r in reports)
    step.first_error = step.first_error or next(
        (r["first_error"] for r in reports if r["first_error"]), ""
    )
    step.wall_s += wall
    step.cycles_per_s.append(cycles / wall)
    step.command_usec += sum(usec for _, usec in stats.values())
    step.evals += stats["eval"][0]
    step.releases += stats["eval"][0] + stats["evalsha"][0]
    deltas = [b - a for a, b in zip(cpu_before, cpu_after, strict=True)]
    step.server_cpu_s += sum(deltas)
    step.busiest_master.append(max(deltas) / wall)
    step.client_cores.append(sum(r["cpu_s"] for r in reports) / wall)
    step.machine_busy.append(machine_busy(machine_before, machine_after))


def run(
    *, steps: Sequence[int] = STEPS, duration: float = DURATION, rounds: int = 2
) -> tuple[str, dict[str, Any]]:
    """Markdown and data for scenario (i)."""
    started = time.monotonic()
    uptime_before = uptime()
    found = {p: Step(p) for p in steps}
    with local_masters(MASTERS) as masters:
        for r in range(rounds):
            order = list(steps) if r % 2 == 0 else list(reversed(steps))
            for p in order:
                one_step(masters, found[p], duration, f"{r}:{p}")
    took = time.monotonic() - started

    def mean(values: Sequence[float]) -> float:
        return statistics.fmean(values) if values else math.nan

    rows: dict[str, dict[str, Any]] = {}
    for p, step in found.items():
        per_cycle = 1e6 / step.cycles if step.cycles else math.nan
        rows[str(p)] = {
            "processes": p,
            "cycles_per_s": statistics.median(step.cycles_per_s) if step.cycles_per_s else math.nan,
            "cycles_per_s_runs": step.cycles_per_s,
            "cycles": step.cycles,
            "failed": step.failed,
            "first_error": step.first_error,
            "command_us_per_cycle": step.command_usec * per_cycle / 1e6,
            "server_cpu_us_per_cycle": step.server_cpu_s * per_cycle,
            "busiest_master_cores": mean(step.busiest_master),
            "client_cores": mean(step.client_cores),
            "client_cpu_us_per_cycle": mean(step.client_cores) * 1e6 / mean(step.cycles_per_s)
            if step.cycles_per_s
            else math.nan,
            "machine_busy": mean(step.machine_busy),
            "eval_share": step.evals / step.releases if step.releases else math.nan,
        }
    best = max(
        rows.values(), key=lambda d: -1 if math.isnan(d["cycles_per_s"]) else d["cycles_per_s"]
    )
    per_master_cpu = best["server_cpu_us_per_cycle"] / MASTERS
    ceiling = 1e6 / per_master_cpu if per_master_cpu > 0 else math.nan
    masters_saturated = best["busiest_master_cores"] >= 0.9
    one = rows[str(steps[0])]["cycles_per_s"]
    table_rows = [
        [
            str(d["processes"]),
            report.with_ratio(d["cycles_per_s"], one, 0)
            + " ["
            + ", ".join(report.number(v, 0) for v in d["cycles_per_s_runs"])
            + "]",
            report.number(d["command_us_per_cycle"], 1),
            report.number(d["server_cpu_us_per_cycle"], 1),
            report.number(d["busiest_master_cores"], 2),
            report.number(d["client_cores"], 2),
            report.number(d["client_cpu_us_per_cycle"], 0),
            f"{d['machine_busy']:.0%}" if not math.isnan(d["machine_busy"]) else "n/a",
            f"{d['eval_share']:.0%}" if not math.isnan(d["eval_share"]) else "n/a",
            f"{d['failed']}" + (f" ({d['first_error']})" if d["first_error"] else ""),
        ]
        for d in rows.values()
    ]
    headers = ["client processes", "cycles/s, all processes (x 1 process) [per round]"]
    headers += ["Redis commandstats us per cycle, all masters"]
    headers += ["Redis CPU us per cycle (INFO cpu), all masters"]
    headers += ["busiest master, cores", "clients, cores", "client CPU us per cycle"]
    headers += ["machine CPUs busy", "releases sent as EVAL", "failed cycles"]
    verdict = (
        f"The masters saturate: the busiest used {best['busiest_master_cores']:.2f} of a core "
        f"at {best['processes']} processes."
        if masters_saturated
        else f"The masters do not saturate here: at the best step ({best['processes']} "
        f"processes, {best['cycles_per_s']:,.0f} cycles/s) the busiest master used "
        f"{best['busiest_master_cores']:.2f} of its one core while the clients used "
        f"{best['client_cores']:.2f} cores and the machine's CPUs were "
        f"{best['machine_busy']:.0%} busy: the clients (about "
        f"{best['client_cpu_us_per_cycle']:,.0f} us of CPU per cycle each, against "
        f"{per_master_cpu:.1f} us on each master) fill the 2 CPUs first. One master's one core "
        f"would take about {ceiling:,.0f} cycles/s at that cost per cycle."
    )
    data: dict[str, Any] = {
        "scenario": "i",
        "environment": report.environment(),
        "uptime": [uptime_before, uptime()],
        "masters": MASTERS,
        "duration_s": duration,
        "rows": rows,
        "member_ceiling_cycles_per_s": ceiling,
        "masters_saturated": masters_saturated,
    }
    text = "\n".join(
        [
            f"## (i) The fleet: 1-{max(steps)} client processes cycling distinct keys, "
            f"{MASTERS} masters",
            "",
            f"{data['environment']}. `{uptime_before}` at the start, `{data['uptime'][1]}` at "
            f"the end. Each step: P worker processes, warm, released by one 'go', each "
            f"acquiring and releasing keys of its own (engine `Redlock(urls).lock(key, "
            f"ttl=10).acquire()` + `release()`) for {duration:g} s; {rounds} rounds, the second "
            "in reverse order (cycles/s: median, each round in brackets; the rest: over the "
            "rounds). Redis commandstats: the cycle's commands' own time (usec of SET, EVALSHA "
            "and EVAL; the commands a script runs are inside its time), summed over the "
            "masters; Redis CPU: used_cpu_sys + used_cpu_user deltas, summed over the masters "
            "(sockets included). Busiest master: its CPU / wall time (1.0 = its one thread is "
            "saturated). Clients: their process_time / wall time. Releases sent as EVAL: with the "
            "script's source, to a master the engine has not seen answer that script on this "
            "connection (a release round returns at quorum: the slower masters' replies are "
            "read after it). Ratios are to 1 process. "
            f"Took {took:.1f} s.",
            "",
            report.table(headers, table_rows),
            "",
            verdict,
        ]
    )
    return text, data
