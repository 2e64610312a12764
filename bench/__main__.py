"""``python -m bench [scenario ...]``: run the scenarios side by side with the peers, print each
table, save it to bench/results/, and draw bench/results/performance.png (copied to
docs/performance.png after a full run). See bench/README.md."""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable
from typing import Any

from . import (
    burst,
    chart,
    contention,
    cycle,
    distances,
    fleet_cycles,
    handoff,
    memory,
    renewals,
    report,
    waiters,
)

DOCS_PNG = report.RESULTS.parent.parent / "docs" / "performance.png"
FLEET_DOCS_PNG = DOCS_PNG.with_name("fleet.png")

Scenario = Callable[[argparse.Namespace], tuple[str, dict[str, Any]]]

SCENARIOS: dict[str, tuple[str, Scenario]] = {
    "a": (
        "uncontended acquire+release on 5 local masters",
        lambda args: cycle.uncontended(rounds=args.rounds, cycles=args.cycles),
    ),
    "b": (
        "the same, every master behind a loopback proxy adding 1 ms each way",
        lambda args: (
            distances.run(distances_ms=args.distances)
            if args.distances
            else cycle.proxied(delay=args.delay)
        ),
    ),
    "c": (
        "contention: 8 processes x 25 acquisitions of one key held 2 ms",
        lambda args: contention.run(rounds=args.contention_rounds, only=args.only),
    ),
    "d": ("1 of 5 masters killed, then 1 of 5 paused", lambda args: cycle.faults()),
    "e": ("client and Redis memory per held lock", lambda args: memory.run()),
    "f": (
        "many callers in one process: 1,000 asyncio tasks at once (cold and warm), 200 threads "
        "x 10, each on a key of its own",
        lambda args: burst.run(
            tasks=args.tasks,
            threads=args.threads,
            cycles=args.thread_cycles,
            scale_tasks=args.scale_tasks,
            scale_threads=args.scale_threads,
            peers=not args.ours_only,
        ),
    ),
    "g": (
        "2,000 asyncio waiters on one key in one process",
        lambda args: waiters.run(waiters=args.waiters),
    ),
    "h": (
        "10,000 auto-extended leases in one process, one of 3 masters 40 ms away",
        lambda args: renewals.run(leases=args.leases, hold=args.hold),
    ),
    "i": (
        "the fleet: 1-32 client processes cycling distinct keys, total cycles/s and Redis CPU "
        "per cycle",
        lambda args: fleet_cycles.run(
            steps=args.fleet_steps, duration=args.fleet_duration, rounds=args.fleet_rounds
        ),
    ),
    "j": (
        "hot-key hand-offs: 8 processes x 25 holds of 2 ms, ours through redlock() and every "
        "peer, 5 masters and 1 master",
        lambda args: handoff.run(rounds=args.handoff_rounds),
    ),
}
ALIASES = {
    "uncontended": "a",
    "cycle": "a",
    "proxied": "b",
    "contention": "c",
    "faults": "d",
    "memory": "e",
    "burst": "f",
    "crowd": "f",
    "waiters": "g",
    "renewals": "h",
    "processes": "i",
    "handoff": "j",
}

#: Options that count something (rounds, cycles, callers): each must be at least 1.
COUNTS = (
    "rounds",
    "cycles",
    "contention_rounds",
    "tasks",
    "threads",
    "thread_cycles",
    "waiters",
    "leases",
    "fleet_rounds",
    "handoff_rounds",
)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        epilog="scenarios: "
        + "; ".join(f"{k} ({n}): {d}" for k, (d, _) in SCENARIOS.items() for n in [_alias(k)])
        + "; all (default): every scenario, then the chart; chart: redraw the chart from the "
        "saved numbers; profile: where ours spends its time per cycle (see bench/profile.py)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "scenarios",
        nargs="*",
        default=["all"],
        metavar="scenario",
        help="a b c d e f g h i j (or their names), all, chart, profile",
    )
    # Many short rounds rather than few long ones: load from other processes on the machine
    # comes and goes in bursts, and short rounds spread each burst over every implementation.
    parser.add_argument("--rounds", type=int, default=30, help="(a): rounds (default 30)")
    parser.add_argument(
        "--cycles", type=int, default=100, help="(a): cycles per round (default 100)"
    )
    parser.add_argument(
        "--delay", type=float, default=0.001, help="(b): proxy delay each way, s (default 0.001)"
    )
    parser.add_argument(
        "--contention-rounds", type=int, default=2, help="(c): races per implementation (2)"
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="(c): only the rows whose label contains this (repeatable), e.g. --only 'ours'",
    )
    parser.add_argument("--tasks", type=int, default=1000, help="(f): asyncio tasks (1000)")
    parser.add_argument("--threads", type=int, default=200, help="(f): threads (200)")
    parser.add_argument(
        "--thread-cycles", type=int, default=10, help="(f): acquisitions per thread (10)"
    )
    parser.add_argument(
        "--distances",
        type=lambda text: [float(ms) for ms in text.split(",")],
        default=None,
        help="(b): instead of one delay, the five masters' round trips in ms (e.g. 1,1,1,20,40)",
    )
    parser.add_argument(
        "--scale-tasks",
        type=lambda text: [int(n) for n in text.split(",")],
        default=list(burst.SCALE_TASKS),
        help="(f): ours alone at these burst sizes (1000,10000,20000,50000)",
    )
    parser.add_argument(
        "--scale-threads", type=int, default=burst.SCALE_THREADS, help="(f): ours alone (1000)"
    )
    parser.add_argument(
        "--ours-only", action="store_true", help="(f): leave out the peers' side-by-side tables"
    )
    parser.add_argument("--waiters", type=int, default=2000, help="(g): waiters (2000)")
    parser.add_argument(
        "--leases", type=int, default=10_000, help="(h): auto-extended leases (10000)"
    )
    parser.add_argument("--hold", type=float, default=25.0, help="(h): seconds they are held (25)")
    parser.add_argument(
        "--fleet-steps",
        type=lambda text: [int(n) for n in text.split(",")],
        default=list(fleet_cycles.STEPS),
        help="(i): client process counts (1,2,4,8,16,32)",
    )
    parser.add_argument(
        "--fleet-duration",
        type=float,
        default=fleet_cycles.DURATION,
        help="(i): seconds each step cycles (3)",
    )
    parser.add_argument("--fleet-rounds", type=int, default=2, help="(i): rounds (2)")
    parser.add_argument("--handoff-rounds", type=int, default=2, help="(j): races per row (2)")
    args = parser.parse_args()
    too_small = [name for name in COUNTS if getattr(args, name) < 1]
    if too_small:
        options = ", ".join("--" + name.replace("_", "-") for name in too_small)
        parser.error(f"{options}: must be >= 1")
    if not 0 < args.delay < 1:
        parser.error(f"--delay must be between 0 and 1 second, got {args.delay}")
    if not args.fleet_duration > 0:
        parser.error(
            f"--fleet-duration must be a positive number of seconds, got {args.fleet_duration}"
        )
    if not args.fleet_steps or min(args.fleet_steps) < 1:
        parser.error(f"--fleet-steps: each must be >= 1, got {args.fleet_steps}")
    if not args.hold > 0:
        parser.error(f"--hold must be a positive number of seconds, got {args.hold}")
    wanted = [ALIASES.get(s, s) for s in args.scenarios]
    unknown = [s for s in wanted if s not in (*SCENARIOS, "all", "chart", "profile")]
    if unknown:
        choices = "a b c d e f g h i j all chart profile"
        parser.error(f"unknown scenario {', '.join(unknown)}; choose from {choices}")

    if "profile" in wanted:
        from . import profile

        profile.main()
        return
    full = "all" in wanted
    started = time.monotonic()
    for key in SCENARIOS if full else [s for s in SCENARIOS if s in wanted]:
        before = report.cpu_times()
        text, data = SCENARIOS[key][1](args)
        text += "\n\n" + report.cpu_note(before, report.cpu_times())
        print(text, f"\n(saved to {report.save(key, text, data)})\n", flush=True)
    draw(copy_to_docs=full)  # from every scenario's last saved numbers
    if full or "i" in wanted:
        draw_fleet()
    if full:
        print(f"All scenarios took {time.monotonic() - started:.0f} s.")


def draw(*, copy_to_docs: bool) -> None:
    if not chart.available():
        print(
            "No chart: matplotlib is not installed (pip install -e '.[bench]' adds it); "
            "the tables above are complete without it."
        )
        return
    path = chart.draw()
    if path is None:
        print("No chart: no saved numbers in bench/results/ yet.")
        return
    print(f"Chart: {path}")
    if copy_to_docs:
        DOCS_PNG.parent.mkdir(exist_ok=True)
        shutil.copyfile(path, DOCS_PNG)
        print(f"Copied to {DOCS_PNG} (docs/performance.md shows it).")


def draw_fleet() -> None:
    """The fleet's curve alone, copied to docs/fleet.png (docs/scaling.md shows it)."""
    if not chart.available():
        return
    path = chart.draw_fleet()
    if path is not None:
        shutil.copyfile(path, FLEET_DOCS_PNG)
        print(f"Fleet chart: {path}, copied to {FLEET_DOCS_PNG} (docs/scaling.md shows it).")


def _alias(key: str) -> str:
    return next(name for name, k in ALIASES.items() if k == key)


if __name__ == "__main__":
    main()
