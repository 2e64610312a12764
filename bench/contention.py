"""Scenario (c): contention. 8 processes x 25 blocking acquisitions of one resource, each held
2 ms, on 5 local masters (single-node locks: on the first one).

Every implementation that can block (or retry) gets its own 8 worker processes (``worker.py
contend``), started and warmed up (connections open, scripts loaded) before one ``go`` line
releases them all at once. Implementations take turns, in rounds, the order rotated each round.

Measured from the workers' monotonic timelines (``CLOCK_MONOTONIC`` is shared by all processes):

- efficiency = ideal hold time (acquisitions x 2 ms) / wall time (first attempt to last release):
  1.0 means the lock was never idle while someone wanted it;
- wait: from asking for the lock to holding it, per acquisition (p50, p99, max);
- overlaps: pairs of holds by different workers that overlap in time (must be 0: a lock that
  lets two holders in at once is broken, however fast it is).
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from django_redlock.testing.masters import LocalMaster, local_masters

from . import report
from .remote import Unavailable, spawn

PROCESSES = 8
ACQUISITIONS = 25
HOLD = 0.002
TTL = 10.0
#: A worker that has not reported this long after ``go`` is stuck: its row says so.
DEADLINE = 120.0

#: (row label, worker implementation, masters used, how it waits)
IMPLEMENTATIONS = [
    (
        "ours (sync)",
        "ours",
        "5",
        "lock(r, wait=60).acquire(): waiters queue on the masters; a release wakes the head of "
        "the queue alone, through its process's inbox (fallback: retry after 50-100 ms)",
    ),
    (
        "ours (sync, cold)",
        "ours",
        "5",
        "the same, in worker processes that were not warmed up: each one's first acquisition "
        "opens its connections",
    ),
    ("pottery", "pottery", "5", "acquire(): retries after a random 0-200 ms"),
    ("redlock-py", "redlock-py", "5", "lock() until it returns a lock: 3 tries 200 ms apart each"),
    ("redlock-ng", "redlock-ng", "5", "acquire(blocking=True): retries after 100-300 ms"),
    (
        "single: python-redis-lock",
        "python-redis-lock",
        "1",
        "acquire(): BLPOP on a signal list that the release pushes to",
    ),
    ("single: redis-py Lock", "redis-py-lock", "1", "acquire(): polls every 100 ms"),
]


@dataclass
class Race:
    """All acquisitions of one implementation over its rounds."""

    efficiencies: list[float] = field(default_factory=list)
    waits_ns: list[int] = field(default_factory=list)
    overlaps: int = 0
    acquired: int = 0
    errors: list[str] = field(default_factory=list)
    #: Redis commands the masters ran, by name (summed over masters and rounds).
    commands: dict[str, int] = field(default_factory=dict)
    #: Each worker's holds, (got, done) in monotonic ns, one list per process (``bench.handoff``).
    holds_by_process: list[list[tuple[int, int]]] = field(default_factory=list)
    #: The race's first attempt and last release, monotonic ns (0 if nothing was reported).
    start: int = 0
    end: int = 0


#: Rows whose workers are not warmed up before the race (``worker.py contend``, ``cold``).
COLD = {"ours (sync, cold)"}

#: Commands counted per acquisition: SET (attempts x masters), the scripts that release or undo,
#: and PUBLISH (a release notice per master; counted also when a script calls it).
COUNTED = ("set", "script", "publish")


def reset_stats(masters: Sequence[LocalMaster]) -> None:
    for master in masters:
        client = master.client()
        try:
            client.config_resetstat()
        finally:
            client.close()


def command_counts(masters: Sequence[LocalMaster]) -> dict[str, int]:
    """Calls per counted command since the last ``reset_stats``, summed over ``masters``."""
    counts = dict.fromkeys(COUNTED, 0)
    for master in masters:
        client = master.client()
        try:
            for name, stats in client.info("commandstats").items():
                command = name.removeprefix("cmdstat_")
                command = "script" if command in ("eval", "evalsha") else command
                if command in counts:
                    counts[command] += int(stats["calls"])
        finally:
            client.close()
    return counts


def race(
    implementation: str,
    urls: Sequence[str],
    key: str,
    *,
    processes: int,
    count: int,
    cold: bool = False,
) -> Race:
    """One race: ``processes`` workers, ``count`` acquisitions each, all released by one ``go``;
    ``cold``: workers not warmed up (their first acquisition connects)."""
    config = {"urls": list(urls), "key": key, "ttl": TTL, "count": count, "hold": HOLD}
    config["cold"] = cold
    result = Race()
    with _workers(implementation, config, processes) as workers:
        for proc in workers:
            assert proc.stdout is not None
            if not json.loads(proc.stdout.readline() or "{}").get("ready"):
                result.errors.append(f"a worker did not start (exit {proc.poll()})")
                return result
        for proc in workers:  # "go" to all, as close together as we can
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
                result.errors.append(f"a worker died (exit {proc.poll()})")
    holds = sorted((got, done) for r in reports for got, done in r["holds"])
    latest_end = 0
    for got, done in holds:  # in order of acquisition: each must begin after all before it ended
        result.overlaps += got < latest_end
        latest_end = max(latest_end, done)
    result.acquired = len(holds)
    result.waits_ns = [w for r in reports for w in r["waits_ns"]]
    for r in reports:
        result.errors.extend(r["errors"])
    result.holds_by_process = [[(got, done) for got, done in r["holds"]] for r in reports]
    if reports and holds:
        result.start = min(r["start"] for r in reports)
        result.end = max(r["end"] for r in reports)
        wall = result.end - result.start
        result.efficiencies.append(len(holds) * HOLD * 1e9 / wall)
    return result


@contextlib.contextmanager
def _workers(
    implementation: str, config: dict[str, Any], processes: int
) -> Iterator[list[subprocess.Popen[str]]]:
    workers: list[subprocess.Popen[str]] = []
    try:
        for _ in range(processes):
            workers.append(spawn("contend", implementation, config))
        yield workers
    finally:
        for proc in workers:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                proc.wait(timeout=DEADLINE)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def run(
    *, rounds: int = 2, processes: int = PROCESSES, count: int = ACQUISITIONS
) -> tuple[str, dict[str, Any]]:
    """Markdown and data for scenario (c)."""
    started = time.monotonic()
    races = {label: Race() for label, *_ in IMPLEMENTATIONS}
    with local_masters(5) as masters:
        urls = [m.url for m in masters]
        for r in range(rounds):
            shift = r % len(IMPLEMENTATIONS)
            for label, implementation, used, _ in [
                *IMPLEMENTATIONS[shift:],
                *IMPLEMENTATIONS[:shift],
            ]:
                targets = urls if used == "5" else urls[:1]
                cold = label in COLD
                reset_stats(masters)
                try:
                    one = race(
                        implementation,
                        targets,
                        f"bench:contend:{implementation}:{'cold' if cold else 'warm'}:{r}",
                        processes=processes,
                        count=count,
                        cold=cold,
                    )
                except Unavailable as exc:
                    one = Race(errors=[f"not measured: {exc}"])
                total = races[label]
                total.efficiencies += one.efficiencies
                total.waits_ns += one.waits_ns
                total.overlaps += one.overlaps
                total.acquired += one.acquired
                total.errors += one.errors
                for command, calls in command_counts(masters).items():
                    total.commands[command] = total.commands.get(command, 0) + calls
    took = time.monotonic() - started

    data: dict[str, Any] = {"scenario": "c", "environment": report.environment(), "rows": {}}
    for label, race_ in races.items():
        waits = sorted(race_.waits_ns)
        data["rows"][label] = {
            "efficiency": statistics.median(race_.efficiencies) if race_.efficiencies else math.nan,
            "efficiency_runs": race_.efficiencies,
            "wait_p50_ms": report.percentile_ms(waits, 0.50),
            "wait_p99_ms": report.percentile_ms(waits, 0.99),
            "wait_max_ms": report.percentile_ms(waits, 1.0),
            "acquired": race_.acquired,
            "overlaps": race_.overlaps,
            "commands_per_acquisition": {
                c: n / race_.acquired for c, n in race_.commands.items() if race_.acquired
            },
            "errors": race_.errors[:1],
        }
    rows_data = data["rows"]
    best_eff = report.best_peer(rows_data, "efficiency", highest=True)
    best = {
        k: report.best_peer(rows_data, k) for k in ("wait_p50_ms", "wait_p99_ms", "wait_max_ms")
    }
    rows = []
    for label, _, used, how in IMPLEMENTATIONS:
        d = rows_data[label]
        runs = ", ".join(f"{e:.2f}" for e in d["efficiency_runs"])
        rows.append(
            [
                label,
                used,
                report.with_ratio(d["efficiency"], best_eff, 2) + (f" [{runs}]" if runs else ""),
                report.with_ratio(d["wait_p50_ms"], best["wait_p50_ms"], 1),
                report.with_ratio(d["wait_p99_ms"], best["wait_p99_ms"], 1),
                report.with_ratio(d["wait_max_ms"], best["wait_max_ms"], 1),
                f"{d['acquired']}/{rounds * processes * count}",
                str(d["overlaps"]),
                " / ".join(
                    report.number(d["commands_per_acquisition"].get(c, math.nan), 1)
                    for c in COUNTED
                ),
                how + (f" ({d['errors'][0]})" if d["errors"] else ""),
            ]
        )
    headers = ["implementation", "masters", "efficiency [per round]", "wait p50 ms"]
    headers += ["wait p99 ms", "wait max ms", "acquired", "overlaps"]
    headers += ["per acquisition: SET / scripts / PUBLISH", "how it waits"]
    text = "\n".join(
        [
            "## (c) Contention: "
            f"{processes} processes x {count} acquisitions of one key, each held "
            f"{HOLD * 1000:.0f} ms",
            "",
            f"{data['environment']}. {rounds} rounds, order rotated each round; worker processes "
            f"started and warm before one 'go'. Efficiency = {processes * count} x "
            f"{HOLD * 1000:.0f} ms / wall time (median of the rounds; each round in brackets); "
            "waits over all rounds. No floor here: ratios are to the best peer (ours excluded) "
            "for that column. Per acquisition: commands the masters ran, summed over the masters "
            "(a 5-master attempt is 5 SETs; worker warm-ups included). 'cold': worker processes "
            "not warmed up, their first acquisition (connects, script loading) in the race. "
            "Targets for ours (issue 10): efficiency >= 0.7, max wait <= 100 ms, cold too. "
            f"Took {took:.1f} s.",
            "",
            report.table(headers, rows),
        ]
    )
    return text, data
