"""``python -m bench [cycle|faults|all]``: run scenarios, print markdown, save bench/results/."""

from __future__ import annotations

import argparse

from . import cycle, report


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "scenario",
        nargs="?",
        default="all",
        choices=["all", "cycle", "faults"],
        help="cycle: uncontended cycle on 5 healthy masters; faults: scenario (d), one master "
        "killed then one paused; all (default): both",
    )
    # Many short rounds rather than few long ones: load from other processes on the machine
    # comes and goes in bursts, and short rounds spread each burst over every implementation.
    parser.add_argument("--rounds", type=int, default=30, help="cycle: rounds (default 30)")
    parser.add_argument(
        "--cycles", type=int, default=100, help="cycle: cycles per round (default 100)"
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.cycles < 1:
        parser.error(f"--rounds and --cycles must be >= 1, got {args.rounds} and {args.cycles}")

    if args.scenario in ("all", "cycle"):
        text = cycle.healthy(rounds=args.rounds, cycles=args.cycles)
        print(text, f"\n(saved to {report.save('cycle', text)})\n", flush=True)
    if args.scenario in ("all", "faults"):
        text = cycle.faults()
        print(text, f"\n(saved to {report.save('faults', text)})\n", flush=True)


if __name__ == "__main__":
    main()
