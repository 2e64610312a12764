"""The performance chart: one PNG with a panel per scenario, drawn from the numbers the last runs
saved in ``bench/results/*.json``. Needs matplotlib (``pip install -e '.[bench]'``); without it
the benchmark prints its tables and says that no chart was drawn."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import report

PNG = report.RESULTS / "performance.png"
#: The fleet's curve alone (scenario i), the picture of docs/scaling.md.
FLEET_PNG = report.RESULTS / "fleet.png"

OURS = "#c0392b"
FLOOR = "#7f8c8d"
PEER = "#2980b9"
SINGLE = "#95a5a6"


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def color(name: str) -> str:
    if name.startswith("ours"):
        return OURS
    if name.startswith("floor"):
        return FLOOR
    if name.startswith("single"):
        return SINGLE
    return PEER


def draw(path: Path = PNG) -> Path | None:
    """Draw every scenario that has saved numbers; None if there are none."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    saved = {s: report.load(s) for s in ("a", "b", "c", "d", "e", "i", "j")}
    if not any(saved.values()):
        return None
    fig, axes = plt.subplots(4, 2, figsize=(14, 20))
    panels = [
        (_cycle, saved["a"], "(a) uncontended cycle, 5 local masters"),
        (_cycle, saved["b"], "(b) the same, each master behind a 1 ms-each-way proxy"),
        (_efficiency, saved["c"], "(c) contention: efficiency (higher is better)"),
        (_waits, saved["c"], "(c) contention: wait per acquisition"),
        (_faults, saved["d"], "(d) one of 5 masters down: median cycle"),
        (_memory, saved["e"], "(e) memory per held lock"),
        (_fleet, saved["i"], "(i) the fleet: cycles/s with 1-32 client processes"),
        (_handoffs, saved["j"], "(j) hot key: hand-offs/s and Jain's fairness"),
    ]
    for ax, (panel, data, title) in zip(axes.flat, panels, strict=True):
        ax.set_title(title, fontsize=11, loc="left")
        if data is None:
            ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        panel(ax, data)
    environment = next(d["environment"] for d in saved.values() if d)
    fig.suptitle(
        "django-redlock vs the raw Redlock floor and peer libraries "
        "(python -m bench; lower is better unless noted)",
        fontsize=13,
    )
    fig.text(0.5, 0.005, environment, ha="center", fontsize=8, color="#555555")
    fig.tight_layout(rect=(0, 0.015, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def draw_fleet(path: Path = FLEET_PNG) -> Path | None:
    """The fleet's curve (scenario i) alone; None if it has not been run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = report.load("i")
    if data is None:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.8))
    ax.set_title("(i) lock cycles/s with 1-32 client processes, 5 masters", fontsize=11, loc="left")
    _fleet(ax, data)
    fig.text(0.5, 0.005, data["environment"], ha="center", fontsize=6, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _bars(ax: Any, names: list[str], values: list[float], labels: list[str], unit: str) -> None:
    shown = [0.0 if math.isnan(v) else v for v in values]
    y = list(range(len(names)))
    ax.barh(y, shown, color=[color(n) for n in names])
    ax.set_yticks(y, names, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(unit, fontsize=9)
    top = max(shown, default=1.0) or 1.0
    for i, (v, label) in enumerate(zip(shown, labels, strict=True)):
        ax.text(v + top * 0.01, i, label, va="center", fontsize=8)
    ax.set_xlim(0, top * 1.3)


def _cycle(ax: Any, data: dict[str, Any]) -> None:
    rows = data["rows"]
    floor = rows[data["floor"]]["median"]
    names = list(rows)
    values = [rows[n]["median"] for n in names]
    labels = [
        "failed"
        if math.isnan(v)
        else f"{v:,.{1 if data['unit'] == 'ms' else 0}f} ({v / floor:.2f}x)"
        for v in values
    ]
    _bars(ax, names, values, labels, f"median {data['unit']} per acquire+release")


def _efficiency(ax: Any, data: dict[str, Any]) -> None:
    rows = data["rows"]
    names = list(rows)
    values = [rows[n]["efficiency"] for n in names]
    _bars(ax, names, values, [f"{v:.2f}" for v in values], "ideal hold time / wall time")
    ax.axvline(0.7, color=OURS, linestyle="--", linewidth=1)
    ax.text(0.7, len(names) - 0.5, " target 0.7", color=OURS, fontsize=8)


def _waits(ax: Any, data: dict[str, Any]) -> None:
    rows = data["rows"]
    names = list(rows)
    y = list(range(len(names)))
    p50 = [rows[n]["wait_p50_ms"] for n in names]
    worst = [rows[n]["wait_max_ms"] for n in names]
    ax.barh(y, worst, color=[color(n) for n in names], alpha=0.35, label="max")
    ax.barh(y, p50, color=[color(n) for n in names], label="p50")
    ax.set_yticks(y, names, fontsize=9)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("wait ms (log): dark p50, light max", fontsize=9)
    for i, (a, b) in enumerate(zip(p50, worst, strict=True)):
        ax.text(b * 1.1, i, f"p50 {a:,.1f} / max {b:,.0f}", va="center", fontsize=8)
    ax.axvline(100, color=OURS, linestyle="--", linewidth=1)
    ax.set_xlim(min([v for v in p50 if v > 0] or [0.1]) / 2, max(worst) * 20)


def _faults(ax: Any, data: dict[str, Any]) -> None:
    names: list[str] = []
    values: list[float] = []
    labels: list[str] = []
    for fault, found in data["faults"].items():
        for name, row in found["rows"].items():
            names.append(f"{fault}: {name}")
            values.append(row["median_ms"])
            v = row["median_ms"]
            labels.append("failed" if math.isnan(v) else f"{v:,.2f} ms")
    shown = [math.nan if math.isnan(v) else max(v, 0.01) for v in values]
    y = list(range(len(names)))
    ax.barh(
        y,
        [0 if math.isnan(v) else v for v in shown],
        color=[color(n.split(": ", 1)[1]) for n in names],
    )
    ax.set_yticks(y, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("median ms per cycle (log)", fontsize=9)
    for i, (v, label) in enumerate(zip(shown, labels, strict=True)):
        ax.text(0.012 if math.isnan(v) else v * 1.1, i, label, va="center", fontsize=7)
    bounds = [found["bound_ms"] for found in data["faults"].values()]
    for bound in sorted({round(b, 1) for b in bounds}):
        ax.axvline(bound, color=OURS, linestyle="--", linewidth=1)
    ax.set_xlim(0.01, max(v for v in shown if not math.isnan(v)) * 20)


def _memory(ax: Any, data: dict[str, Any]) -> None:
    rows = {n: r for n, r in data["rows"].items() if "error" not in r}
    names = list(rows)
    y = list(range(len(names)))
    client = [rows[n]["client_bytes"] for n in names]
    server = [rows[n]["redis_bytes"] for n in names]
    ax.barh([i - 0.2 for i in y], client, height=0.4, color=[color(n) for n in names])
    ax.barh([i + 0.2 for i in y], server, height=0.4, color=[color(n) for n in names], alpha=0.4)
    ax.set_yticks(y, names, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel(
        "bytes per held lock: dark = client (tracemalloc), light = all masters", fontsize=9
    )
    top = max([*client, *server, 1.0])
    for i, (c, s) in enumerate(zip(client, server, strict=True)):
        ax.text(max(c, s) + top * 0.01, i, f"{c:,.0f} / {s:,.0f}", va="center", fontsize=8)
    ax.set_xlim(0, top * 1.3)


def _fleet(ax: Any, data: dict[str, Any]) -> None:
    rows = list(data["rows"].values())
    processes = [r["processes"] for r in rows]
    ax.plot(processes, [r["cycles_per_s"] for r in rows], "o-", color=OURS, label="cycles/s")
    ax.set_xscale("log", base=2)
    ax.set_xticks(processes, [str(p) for p in processes])
    ax.set_xlabel("client processes (each cycling keys of its own)", fontsize=9)
    ax.set_ylabel("lock cycles/s, all processes", fontsize=9)
    ax.set_ylim(0, max(r["cycles_per_s"] for r in rows) * 1.3)
    for p, r in zip(processes, rows, strict=True):
        ax.annotate(f"{r['cycles_per_s']:,.0f}", (p, r["cycles_per_s"]), fontsize=8,
                    textcoords="offset points", xytext=(0, 6), ha="center")  # fmt: skip
    cores = ax.twinx()
    cores.plot(processes, [r["busiest_master_cores"] for r in rows], "s--", color=FLOOR,
               label="busiest master, cores")  # fmt: skip
    cores.plot(processes, [r["client_cores"] for r in rows], "^--", color=PEER,
               label="clients, cores")  # fmt: skip
    cores.set_ylabel("CPU cores used", fontsize=9)
    cores.set_ylim(0, max(2.0, *(r["client_cores"] for r in rows)) * 1.1)
    cores.axhline(1.0, color=FLOOR, linestyle=":", linewidth=1)
    lines = ax.get_legend_handles_labels()
    more = cores.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")


def _handoffs(ax: Any, data: dict[str, Any]) -> None:
    rows = data["rows"]
    names = list(rows)
    values = [rows[n]["handoffs_per_s"] for n in names]
    labels = [
        f"{report.number(rows[n]['handoffs_per_s'])}/s, J {report.number(rows[n]['fairness'], 2)}"
        f", max wait {report.number(rows[n]['wait_max_ms'])} ms"
        for n in names
    ]
    _bars(ax, names, values, labels, "hand-offs per second (higher is better); J = Jain's index")
    ax.set_xlim(0, (max([v for v in values if not math.isnan(v)], default=1.0) or 1.0) * 2.0)
