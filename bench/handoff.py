"""Scenario (j): the hot-key hand-off table. Scenario (c)'s race (8 processes x 25 blocking
acquisitions of one key, each held 2 ms, workers warm before one ``go``: ``contention.race``)
for ours through ``django_redlock.redlock()`` with Django settings, and every peer, on 5 masters
and on 1 master in the same run (a single-node peer locks one master only: 1 master rows).

Per race, from the workers' shared ``CLOCK_MONOTONIC`` timelines:

- hand-offs/s: holds that went to a different process than the hold before, per second of wall
  time (first attempt to last release); a lock that lets its releaser take it again at once
  (barging) holds often but hands off less;
- holds/s: every hold, per second of wall time;
- longest wait: from asking to holding, the worst of all the rounds' acquisitions;
- fairness: Jain's index J = (sum x)^2 / (n * sum x^2) over the n processes, where x is how many
  holds a process got while all of them were still asking (from the first attempt until the
  first process had all its holds): 1.0 = every process got as many, 1/n = one process got them
  all.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django_redlock.testing.masters import local_masters

from . import report
from .contention import HOLD, Race, race
from .remote import Unavailable

PROCESSES = 8
ACQUISITIONS = 25

#: (row label, worker implementation, masters it locks, how it waits)
IMPLEMENTATIONS: list[tuple[str, str, int, str]] = [
    (
        "ours: redlock()",
        "ours-django",
        5,
        "with Django settings (REDLOCK NODES): redlock(key, ttl=10, wait=60).acquire(); "
        "waiters queue on the masters, a release hands the lock to the head of the queue",
    ),
    ("ours: redlock()", "ours-django", 1, "the same, NODES with one master"),
    ("pottery", "pottery", 5, "Redlock.acquire(): retries after a random 0-200 ms"),
    ("pottery", "pottery", 1, "the same over one master"),
    ("redlock-py", "redlock-py", 5, "lock() until it returns a lock: 3 tries 200 ms apart"),
    ("redlock-py", "redlock-py", 1, "the same over one master"),
    ("redlock-ng", "redlock-ng", 5, "acquire(blocking=True): retries after 100-300 ms"),
    ("redlock-ng", "redlock-ng", 1, "the same over one master"),
    (
        "python-redis-lock",
        "python-redis-lock",
        1,
        "single node: acquire(): BLPOP on a signal list that the release pushes to",
    ),
    ("redis-py Lock", "redis-py-lock", 1, "single node: acquire(): polls every 100 ms"),
    (
        "django-redis cache.lock()",
        "django-redis",
        1,
        "single node: redis-py's Lock from the cache client, polls every 100 ms",
    ),
]


def row_name(label: str, masters: int) -> str:
    return f"{label}, {masters} master{'s' if masters > 1 else ''}"


def handoffs(race_: Race) -> int:
    """How many holds went to a different process than the hold just before."""
    order = sorted((got, p) for p, holds in enumerate(race_.holds_by_process) for got, _ in holds)
    return sum(a[1] != b[1] for a, b in zip(order, order[1:], strict=False))


def jain(race_: Race) -> float:
    """Jain's index over processes of the holds each got while all were still asking (until the
    first process had made its last release); NaN if a process reported nothing."""
    per_process = race_.holds_by_process
    if not per_process or any(not holds for holds in per_process):
        return math.nan
    contested_until = min(holds[-1][1] for holds in per_process)
    x = [sum(got < contested_until for got, _ in holds) for holds in per_process]
    squares = sum(v * v for v in x)
    return sum(x) ** 2 / (len(x) * squares) if squares else math.nan


@dataclass
class Row:
    holds_per_s: list[float] = field(default_factory=list)
    handoffs_per_s: list[float] = field(default_factory=list)
    fairness: list[float] = field(default_factory=list)
    efficiency: list[float] = field(default_factory=list)
    waits_ns: list[int] = field(default_factory=list)
    acquired: int = 0
    overlaps: int = 0
    errors: list[str] = field(default_factory=list)


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uptime: n/a"


def run(
    *, rounds: int = 2, processes: int = PROCESSES, count: int = ACQUISITIONS
) -> tuple[str, dict[str, Any]]:
    """Markdown and data for scenario (j)."""
    started = time.monotonic()
    uptime_before = uptime()
    rows = {row_name(label, n): Row() for label, _, n, _ in IMPLEMENTATIONS}
    with local_masters(5) as masters:
        urls = [m.url for m in masters]
        for r in range(rounds):
            shift = r % len(IMPLEMENTATIONS)
            for label, implementation, used, _ in [
                *IMPLEMENTATIONS[shift:],
                *IMPLEMENTATIONS[:shift],
            ]:
                name = row_name(label, used)
                try:
                    one = race(
                        implementation,
                        urls[:used],
                        f"bench:handoff:{implementation}:{used}:{r}",
                        processes=processes,
                        count=count,
                    )
                except Unavailable as exc:
                    one = Race(errors=[f"not measured: {exc}"])
                row = rows[name]
                row.errors += one.errors
                row.acquired += one.acquired
                row.overlaps += one.overlaps
                row.waits_ns += one.waits_ns
                row.efficiency += one.efficiencies
                if one.end > one.start:
                    wall = (one.end - one.start) / 1e9
                    row.holds_per_s.append(one.acquired / wall)
                    row.handoffs_per_s.append(handoffs(one) / wall)
                    row.fairness.append(jain(one))
    took = time.monotonic() - started

    def median(values: Sequence[float]) -> float:
        return statistics.median(values) if values else math.nan

    data: dict[str, Any] = {"scenario": "j", "environment": report.environment(), "rows": {}}
    data["uptime"] = [uptime_before, uptime()]
    for name, row in rows.items():
        data["rows"][name] = {
            "masters": next(n for label, _, n, _ in IMPLEMENTATIONS if row_name(label, n) == name),
            "handoffs_per_s": median(row.handoffs_per_s),
            "holds_per_s": median(row.holds_per_s),
            "fairness": median(row.fairness),
            "fairness_runs": row.fairness,
            "efficiency": median(row.efficiency),
            "wait_p50_ms": report.percentile_ms(row.waits_ns, 0.50),
            "wait_max_ms": report.percentile_ms(row.waits_ns, 1.0),
            "acquired": row.acquired,
            "overlaps": row.overlaps,
            "errors": row.errors[:1],
        }
    table_rows = []
    for label, _, used, how in IMPLEMENTATIONS:
        name = row_name(label, used)
        d = data["rows"][name]
        same = {k: v for k, v in data["rows"].items() if v["masters"] == used}
        best_handoffs = report.best_peer(same, "handoffs_per_s", highest=True)
        best_holds = report.best_peer(same, "holds_per_s", highest=True)
        best_wait = report.best_peer(same, "wait_max_ms")
        best_fair = report.best_peer(same, "fairness", highest=True)
        fair_runs = ", ".join(report.number(v, 2) for v in d["fairness_runs"])
        table_rows.append(
            [
                label,
                str(used),
                report.with_ratio(d["handoffs_per_s"], best_handoffs, 0),
                report.with_ratio(d["holds_per_s"], best_holds, 0),
                report.with_ratio(d["wait_max_ms"], best_wait, 0),
                report.number(d["wait_p50_ms"], 1),
                report.with_ratio(d["fairness"], best_fair, 2)
                + (f" [{fair_runs}]" if fair_runs else ""),
                report.number(d["efficiency"], 2),
                f"{d['acquired']}/{rounds * processes * count}",
                str(d["overlaps"]),
                how + (f" ({d['errors'][0]})" if d["errors"] else ""),
            ]
        )
    headers = ["implementation", "masters", "hand-offs/s", "holds/s", "longest wait ms"]
    headers += ["wait p50 ms", "Jain's fairness [per round]", "efficiency", "acquired"]
    headers += ["overlaps", "how it waits"]
    text = "\n".join(
        [
            f"## (j) Hot key: {processes} processes x {count} holds of "
            f"{HOLD * 1000:.0f} ms, 5 masters and 1 master",
            "",
            f"{data['environment']}. `{uptime_before}` at the start, `{data['uptime'][1]}` at "
            f"the end. {rounds} rounds, order "
            "rotated each round; worker processes started and warm before one 'go'. "
            "hand-offs/s: holds that went to another process than the hold before, per second "
            "of wall time (first attempt to last release); holds/s: all holds per second; "
            "longest wait over all rounds. Jain's fairness: (sum x)^2 / (n sum x^2) over the "
            f"{processes} processes, x = holds a process got while all were still asking (until "
            "the first one had its last release); 1 = equal shares, "
            f"{1 / processes:.3f} = one process got all; median of the rounds, each round in "
            "brackets. Efficiency as in (c). Ratios are to the best peer (ours excluded) with "
            "as many masters. Single-node peers lock one master only: their rows are 1-master "
            f"rows. Took {took:.1f} s.",
            "",
            report.table(headers, table_rows),
        ]
    )
    return text, data
