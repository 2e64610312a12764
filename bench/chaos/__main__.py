"""``python -m bench.chaos``: the fault-injection suite at full size, or a soak; prints a summary
table and writes it to ``bench/results/chaos.md`` (a soak: ``chaos-soak.md``; ``--hosts``:
``chaos-hosts.md``). Exits 1 if any scenario is not as it must be (a violation where none is
allowed, a hazard or self-test that did not trip, a failed check, a time bound missed)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import report

from .host_scenarios import HOST_SCENARIOS, all_silent_partition_timings, timings_table
from .hosts import HostsUnavailable, require_root
from .scenarios import FULL, SCENARIOS, Result, Size, soak

WHERE_HOSTS = "each master and client group in a network namespace of its own (veth + bridge)"


def verdict_cell(result: Result) -> str:
    failed = result.failed_checks()
    if failed:
        return "FAILED: " + "; ".join(failed)
    if result.expect_violations:
        return "violations detected (expected)" if result.violations else "NOT DETECTED"
    return "ok" if not result.violations else "VIOLATION"


def table(results: Sequence[tuple[Result, float]]) -> str:
    rows = []
    for result, seconds in results:
        verdict = result.outcome.verdict
        rows.append(
            [
                result.name,
                str(result.outcome.done),
                str(verdict.lost_updates),
                str(verdict.overlaps),
                str(verdict.fence_violations),
                verdict_cell(result),
                f"{seconds:.0f} s",
                "; ".join(result.notes),
            ]
        )
    headers = [
        "scenario",
        "sections",
        "lost updates",
        "overlaps",
        "fence violations",
        "result",
        "time",
        "notes",
    ]
    return report.table(headers, rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--processes", type=int, default=FULL.processes, help="default 8")
    parser.add_argument(
        "--sections", type=int, default=FULL.sections, help="per process (default 250)"
    )
    parser.add_argument(
        "--scenario",
        default="all",
        choices=["all", *SCENARIOS, *HOST_SCENARIOS],
        help="one scenario, or all (default: the loopback ones)",
    )
    parser.add_argument(
        "--hosts",
        action="store_true",
        help="instead: every scenario with masters on separate hosts (network namespaces; needs "
        "root), then the time bounds under a silent partition",
    )
    parser.add_argument(
        "--soak",
        type=float,
        metavar="SECONDS",
        help="instead of the scenarios: work for SECONDS while a random fault hits every 2-4 s",
    )
    parser.add_argument("--seed", type=int, help="soak: seed of the fault sequence")
    args = parser.parse_args(argv)
    if args.processes < 2 or args.sections < 3:
        parser.error(
            f"need --processes >= 2 and --sections >= 3, got {args.processes}, {args.sections}"
        )
    if args.soak is not None and args.soak < 10:
        parser.error(f"--soak must be at least 10 seconds, got {args.soak}")
    if args.hosts and (args.soak is not None or args.scenario != "all"):
        parser.error("--hosts runs every separate-hosts scenario: no --soak or --scenario with it")
    if args.hosts or args.scenario in HOST_SCENARIOS:
        try:
            require_root()
        except HostsUnavailable as exc:
            parser.error(str(exc))

    size = Size(args.processes, args.sections)
    results: list[tuple[Result, float]] = []
    timings = []
    scenarios = {**SCENARIOS, **HOST_SCENARIOS}
    with tempfile.TemporaryDirectory(prefix="redlock-chaos-") as tmp:
        if args.soak is not None:
            names = ["soak"]
        elif args.hosts:
            names = list(HOST_SCENARIOS)
        else:
            names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
        for name in names:
            print(f"{name} ...", end=" ", flush=True)
            began = time.monotonic()
            workdir = Path(tmp) / name
            if args.soak is not None:
                result = soak(args.soak, args.processes, workdir, seed=args.seed)
            else:
                result = scenarios[name].run(size, workdir)
            seconds = time.monotonic() - began
            results.append((result, seconds))
            print(f"{verdict_cell(result)} ({seconds:.0f} s)", flush=True)
        if args.hosts:
            print("time bounds under a silent partition ...", end=" ", flush=True)
            timings = all_silent_partition_timings(Path(tmp) / "bounds")
            print("ok" if all(t.ok for t in timings) else "BOUND MISSED", flush=True)

    what = (
        f"soak {args.soak:.0f} s, {args.processes} processes"
        if args.soak is not None
        else f"{args.processes} processes x {args.sections} sections per scenario"
        + (", masters on separate hosts" if args.hosts else "")
    )
    lines = [
        f"# Chaos: {what}",
        "",
        f"`{' '.join(['python -m bench.chaos', *(sys.argv[1:] if argv is None else argv)])}`"
        f" — {report.environment(WHERE_HOSTS if args.hosts else 'all masters on 127.0.0.1')}",
        "",
        table(results),
    ]
    if timings:
        lines += ["", "Time bounds under a silent partition:", "", timings_table(timings)]
    text = "\n".join(lines)
    kind = "chaos-soak" if args.soak is not None else "chaos-hosts" if args.hosts else "chaos"
    saved = report.save(kind, text)
    print("\n" + text + f"\n\n(saved to {saved})")
    fine = all(result.ok for result, _ in results) and all(t.ok for t in timings)
    return 0 if fine else 1


if __name__ == "__main__":
    sys.exit(main())
