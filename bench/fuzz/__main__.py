"""``python -m bench.fuzz [--seconds N] [--seed S] [--seeds K] [--faults MIX|F1,F2]``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .run import BROKEN, FAULTS, MIXES, Options, run


def faults_of(text: str) -> tuple[str, ...]:
    if text in MIXES:
        return MIXES[text]
    return tuple(f for f in text.split(",") if f)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="of workload, per seed")
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="how many seeds, from --seed on")
    parser.add_argument(
        "--faults",
        default="all",
        help=f"a mix ({', '.join(MIXES)}) or a comma list of: {', '.join(FAULTS)}",
    )
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--solo", type=int, default=2, help="single-caller processes among them")
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--broken", choices=BROKEN, help="a known-broken lock: the checker's test")
    parser.add_argument("--engine-tree", type=Path, help="run the clients on another checkout")
    parser.add_argument(
        "--django",
        type=int,
        default=0,
        metavar="N",
        help="also N processes of the Django workload on a throwaway PostgreSQL",
    )
    args = parser.parse_args(argv)
    failed = 0
    for seed in range(args.seed, args.seed + args.seeds):
        options = Options(
            seconds=args.seconds,
            seed=seed,
            faults=faults_of(args.faults),
            processes=args.processes,
            solo=args.solo,
            ttl=args.ttl,
            broken=args.broken,
            engine_tree=args.engine_tree,
            django=args.django,
        )
        started = time.monotonic()
        outcome = run(options)
        verdict = outcome.verdict
        made = ", ".join(f"{k} {n}" for k, n in sorted(outcome.faults_made.items())) or "none"
        print(
            f"seed {seed}: {verdict.summary()}; faults made: {made}; "
            f"{time.monotonic() - started:.0f} s",
            flush=True,
        )
        for violation in verdict.violations[:10]:
            print(f"  {violation}")
        if outcome.stderr:
            print(f"  clients: {outcome.stderr[:2000]}")
        failed += not verdict.ok or bool(outcome.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
