"""What replica acknowledgement costs (``?wait_replicas=1&wait_timeout=...``: ``engine.acks``).

``python -m bench.replica_ack [--baseline DIR] [--rounds 15 --cycles 200 --tasks 64]``

A real primary with one real replica (``testing.sentinels.primary_and_replica``) and two plain
masters, all on loopback. Each row is a worker process (``WORKER`` below, fed commands on stdin)
that does uncontended acquire+release cycles, one at a time (median and p99 of a cycle) and with
``--tasks`` asyncio tasks at once (cycles per second); rows take turns in rounds, the order
rotated every round, so that load from elsewhere hits them alike. Rows:

- ``off``: the member's plain URL, on this tree; ``on``: the same member with
  ``wait_replicas=1&wait_timeout=0.05`` (NODE_TIMEOUT 0.1);
- ``on, its replica stopped``: on three members, the acked member's replica paused (SIGSTOP):
  every grant there fails its vote after ``wait_timeout``, and the other two carry the quorum;
- ``off (baseline)``: with ``--baseline DIR`` (a checkout of the code before this option, e.g.
  ``git archive main | tar -x -C DIR``), the plain URL on that code: what the option costs a
  member that does not use it.

On one member (the primary alone) and on three (the primary and the two plain masters: a round
returns at quorum, so the acked member's slower reply is waited for only when it is needed).
``uptime`` is printed before and after: read ratios within one run, not absolute numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from django_redlock.testing.masters import local_masters
from django_redlock.testing.sentinels import primary_and_replica

ROOT = Path(__file__).resolve().parent.parent
ACK = "wait_replicas=1&wait_timeout=0.05"
NODE_TIMEOUT = 0.1

#: A row: reads ``seq N`` (N cycles one at a time: answers their durations) or ``par N T``
#: (N cycles in each of T asyncio tasks at once: answers the wall time), one JSON line each.
WORKER = """
import asyncio, json, sys, time
from django_redlock.engine import Redlock, RedlockError
engine = Redlock(
    json.loads(sys.argv[1]), ttl=10, node_timeout=float(sys.argv[2]), key_prefix=sys.argv[3]
)
def seq(n):
    out = []
    cpu = time.process_time_ns()
    for i in range(n):
        began = time.perf_counter_ns()
        try:
            with engine.lock(f"seq:{i % 50}"):
                pass
        except RedlockError:
            failed[0] += 1
        out.append(time.perf_counter_ns() - began)
    return [time.process_time_ns() - cpu, out]
async def par(n, tasks):
    async def run(t):
        for _ in range(n):
            try:
                async with engine.lock(f"par:{t}"):
                    pass
            except RedlockError:
                failed[0] += 1
    began = time.perf_counter_ns()
    await asyncio.gather(*(run(t) for t in range(tasks)))
    return time.perf_counter_ns() - began
failed = [0]
loop = asyncio.new_event_loop()
for line in sys.stdin:
    kind, *args = line.split()
    if kind == "failed":
        answer = failed[0]
    elif kind == "calls":  # Python function calls per cycle: what load cannot blur
        import cProfile, pstats
        profile = cProfile.Profile()
        profile.runcall(seq, int(args[0]))
        answer = pstats.Stats(profile).total_calls / int(args[0])
    elif kind == "seq":
        answer = seq(int(args[0]))
    else:
        answer = loop.run_until_complete(par(int(args[0]), int(args[1])))
    print(json.dumps(answer), flush=True)
"""


class Row:
    def __init__(self, name: str, urls: list[str], code: Path) -> None:
        self.name = name
        self.proc = subprocess.Popen(  # noqa: S603 (our own worker, fixed arguments)
            # A key prefix of its own: a row's release that returned at quorum may still be
            # on its way to a slower member when the next row locks there.
            [sys.executable, "-c", WORKER, json.dumps(urls), str(NODE_TIMEOUT), f"{name}:"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(code)},
            cwd=code,
        )
        self.cycles: list[int] = []
        self.cpu: list[float] = []  # per cycle, per batch
        self.rates: list[float] = []

    def ask(self, line: str) -> object:
        assert self.proc.stdin is not None  # noqa: S101
        assert self.proc.stdout is not None  # noqa: S101
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()  # noqa: S607


@contextmanager
def servers() -> Iterator[tuple[str, list[str], str]]:
    """The primary's URL, the plain masters', and another primary's whose replica is stopped."""
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        primary, _, _ = stack.enter_context(primary_and_replica(work / "pair"))
        plain = stack.enter_context(local_masters(2, work / "plain"))
        orphan, stopped, _ = stack.enter_context(primary_and_replica(work / "stopped"))
        stopped.pause()
        yield primary.url, [m.url for m in plain], orphan.url


def run(rounds: int, cycles: int, tasks: int, baseline: Path | None) -> None:
    print(f"uptime before: {uptime()}")
    with servers() as (primary, plain, orphan), ExitStack() as stack:
        acked = f"{primary}?{ACK}"
        rows: list[Row] = []
        for members, extra in (("1 member", []), ("3 members", plain)):
            wanted = [("off", [primary, *extra], ROOT), ("on", [acked, *extra], ROOT)]
            if baseline is not None:
                wanted.insert(0, ("off (baseline)", [primary, *extra], baseline))
            if extra:  # (alone, it could grant nothing)
                wanted.append(("on, its replica stopped", [f"{orphan}?{ACK}", *extra], ROOT))
            for name, urls, code in wanted:
                row = Row(f"{members}: {name}", urls, code)
                stack.callback(row.close)
                row.ask("seq 50")  # warm: connections open, scripts loaded
                rows.append(row)
        for i in range(rounds):
            order = rows[i % len(rows) :] + rows[: i % len(rows)]
            for row in order:
                batch: Any = row.ask(f"seq {cycles}")
                row.cpu.append(batch[0] / cycles)
                row.cycles += batch[1]
            each = max(1, cycles // tasks)
            for row in order:
                wall = row.ask(f"par {each} {tasks}")
                row.rates.append(each * tasks / (wall / 1e9))  # type: ignore[operator]
        print(f"uptime after:  {uptime()}")
        print(
            f"\n{rounds} rounds x {cycles} cycles per row, interleaved; NODE_TIMEOUT "
            f"{NODE_TIMEOUT}, '{ACK}'; concurrent: {tasks} asyncio tasks\n"
        )
        print(
            "| row | cycle median (us) | cycle p99 (us) | client CPU per cycle (us, median "
            "of batches) | Python calls per cycle | concurrent cycles/s (median) | cycles that "
            "failed |"
        )
        print("|---|---|---|---|---|---|---|")
        for row in rows:
            ordered = sorted(row.cycles)
            median = statistics.median(ordered) / 1000
            p99 = ordered[int(len(ordered) * 0.99)] / 1000
            rate = statistics.median(row.rates)
            cpu = statistics.median(row.cpu) / 1000
            failed = row.ask("failed")
            calls = row.ask(f"calls {cycles}")
            print(
                f"| {row.name} | {median:.0f} | {p99:.0f} | {cpu:.0f} | {calls:.1f} | {rate:.0f} "
                f"| {failed} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    args = parser.parse_args()
    run(args.rounds, args.cycles, args.tasks, args.baseline)


if __name__ == "__main__":
    main()
