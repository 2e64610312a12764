"""Turning timings into numbers and markdown tables, and saving them under ``bench/results/``."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from django_redlock.testing.masters import redis_server_version

RESULTS = Path(__file__).parent / "results"


@dataclass(frozen=True)
class Summary:
    cycles: int
    median_us: float
    p99_us: float
    errors: int
    first_error: str


def summarize(times_ns: Sequence[int], errors: Sequence[str]) -> Summary:
    if not times_ns:
        return Summary(0, math.nan, math.nan, len(errors), errors[0] if errors else "")
    ordered = sorted(times_ns)
    p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
    return Summary(
        cycles=len(ordered),
        median_us=statistics.median(ordered) / 1000,
        p99_us=p99 / 1000,
        errors=len(errors),
        first_error=errors[0] if errors else "",
    )


def percentile_ms(times_ns: Sequence[int], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``times_ns``, in milliseconds; NaN if empty."""
    if not times_ns:
        return math.nan
    ordered = sorted(times_ns)
    return ordered[min(len(ordered) - 1, max(math.ceil(q * len(ordered)) - 1, 0))] / 1e6


def best_peer(rows: dict[str, dict[str, Any]], key: str, *, highest: bool = False) -> float:
    """The best value of ``key`` among the peers' rows (ours excluded: the reference ours is
    compared with where there is no floor); NaN if no peer measured it."""
    values = [
        d[key]
        for label, d in rows.items()
        if not label.startswith("ours") and key in d and not math.isnan(d[key])
    ]
    if not values:
        return math.nan
    return max(values) if highest else min(values)


def failures(row: dict[str, Any]) -> str:
    """A row's failures as one cell: ``row["errors"]`` (``{class: [count, first message]}``) as
    ``3 x Class (first message)``, how long a failure took (``failed_p50_ms``), and releases that
    failed (``release_errors``); "none" when there were none."""
    cell = "; ".join(
        f"{count} x {name}" + (f" ({first})" if first else "")
        for name, (count, first) in row["errors"].items()
    )
    if not math.isnan(row.get("failed_p50_ms", math.nan)):
        cell += f"; failed after {row['failed_p50_ms']:,.0f} ms (p50)"
    if row.get("release_errors"):
        cell += f"; {row['release_errors']} releases failed"
    return cell or "none"


def number(value: float, digits: int = 0) -> str:
    return "n/a" if math.isnan(value) else f"{value:,.{digits}f}"


def with_ratio(value: float, reference: float, digits: int = 0) -> str:
    """``value`` and, in parentheses, ``value / reference`` (e.g. ``125.5 (1.45x)``)."""
    if math.isnan(value):
        return "n/a"
    if math.isnan(reference) or reference == 0:
        return number(value, digits)
    return f"{number(value, digits)} ({value / reference:.2f}x)"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def environment(where: str = "all masters on 127.0.0.1") -> str:
    """One line saying where the numbers come from (they mean little without it)."""
    server = ".".join(str(p) for p in redis_server_version())
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M')}, Python {platform.python_version()}, "
        f"redis-py {redis.__version__}, redis-server {server}, {os.cpu_count()} CPUs, "
        f"load average {load}, {where}, {engine_version()}"
    )


def engine_version() -> str:
    """Which engine was measured: the commit, and whether ``django_redlock/engine`` had changes on
    top of it (the numbers move with the engine)."""
    repo = RESULTS.parent.parent
    try:
        commit = subprocess.run(  # the last commit that changed the library
            ["git", "log", "-1", "--format=%h", "--", "django_redlock/engine"],
            capture_output=True,
            text=True,
            cwd=repo,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "django_redlock/engine"],
            capture_output=True,
            text=True,
            cwd=repo,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "engine version unknown (no git)"
    return f"engine at {commit}" + (" + uncommitted changes" if dirty else "")


def cpu_times() -> list[int]:
    """The machine's CPU time counters (``/proc/stat``: user nice system idle iowait irq softirq
    steal), or [] where there are none."""
    try:
        with open("/proc/stat") as stat:
            return [int(v) for v in stat.readline().split()[1:9]]
    except (OSError, ValueError):
        return []


def cpu_note(before: list[int], after: list[int]) -> str:
    """How busy the machine was between two ``cpu_times()``: load from elsewhere (and time the
    host stole from this virtual machine) is what makes one run differ from the next."""
    if len(before) < 8 or len(after) < 8:
        return ""
    delta = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(delta) or 1
    busy = total - delta[3] - delta[4]
    return (
        f"During this scenario the CPUs were {busy / total:.0%} busy (everything on the "
        f"machine, this benchmark included) and {delta[7] / total:.0%} stolen by the host."
    )


def save(name: str, text: str, data: dict[str, Any] | None = None) -> Path:
    """Write ``bench/results/<name>.md`` (and ``<name>.json``, the numbers the chart reads)."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.md"
    path.write_text(text + "\n")
    if data is not None:  # NaN (allowed by json) stands for "not measured"
        (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    return path


def load(name: str) -> dict[str, Any] | None:
    """The numbers of the last run of scenario ``name``, if any."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data
