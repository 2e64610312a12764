"""Semaphores and readers/writer locks (issue 18), on 5 real local masters:

- **cycle**: one uncontended acquire+release of a permit (``limit=4``) and of a reader, next to a
  plain lock's, interleaved in rounds; median and p99, ratio to the lock (target: permit <= 1.3x).
- **contention**: 16 processes on one semaphore with ``limit=4``, each section holding 2 ms, next
  to the same on a plain lock; efficiency = sections x hold / (wall x N), the longest wait, and
  FIFO: per acquisition, how many callers that asked later got in first ("overtaken by").
- **readers**: 16 processes reading (2 ms each) while one writer writes now and then: the
  writer's waits (no starvation: bounded by the readers' holds, not by their number).

``python -m bench.permits [--sections 40] [--cycles 300]``. Never asserts speed; read ratios.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from django_redlock.engine import LockNotAcquired, Redlock
from django_redlock.testing.masters import local_masters

PROCESSES = 16
HOLD = 0.002


def cycle(urls: Sequence[str], cycles: int) -> list[str]:
    engine = Redlock(list(urls))
    kinds: dict[str, dict[str, Any]] = {
        "lock": {},
        "permit (limit=4)": {"limit": 4},
        "reader (shared=True)": {"shared": True},
    }
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        for rounds in range(cycles // 10 + 2):
            for kind, options in kinds.items():
                lock = engine.lock(f"cycle:{kind}", **options)
                for _ in range(10):
                    began = time.perf_counter()
                    with lock:
                        pass
                    if rounds >= 2:  # two rounds of warm-up
                        samples[kind].append(time.perf_counter() - began)
    finally:
        engine.close()
    base = statistics.median(samples["lock"])
    lines = ["| cycle | median | p99 | vs lock |", "|---|---|---|---|"]
    for kind, values in samples.items():
        values.sort()
        median, p99 = statistics.median(values), values[int(len(values) * 0.99) - 1]
        lines.append(
            f"| {kind} | {median * 1e6:.0f} us | {p99 * 1e6:.0f} us | {median / base:.2f}x |"
        )
    return lines


def _contender(
    urls: list[str], name: str, options: dict[str, Any], sections: int, go: Any, out: Any
) -> None:
    engine = Redlock(urls, retry_delay=0.05)
    go.wait()
    records = []
    try:
        for _ in range(sections):
            asked = time.monotonic()
            try:
                with engine.lock(name, ttl=10, wait=60, **options):
                    got = time.monotonic()
                    time.sleep(HOLD)
            except LockNotAcquired:
                continue
            records.append((asked, got))
    finally:
        engine.close()
        out.put(records)


def contention(urls: Sequence[str], sections: int) -> list[str]:
    lines = [
        "| 16 processes, 2 ms holds | N | sections | wall | efficiency | longest wait | "
        "overtaken by (mean / max) |",
        "|---|---|---|---|---|---|---|",
    ]
    ctx = multiprocessing.get_context("fork")
    for label, limit, options in (
        ("plain lock", 1, {}),
        ("semaphore limit=4", 4, {"limit": 4}),
    ):
        go, out = ctx.Event(), ctx.Queue()
        name = f"contention:{label}"
        procs = [
            ctx.Process(target=_contender, args=(list(urls), name, options, sections, go, out))
            for _ in range(PROCESSES)
        ]
        for p in procs:
            p.start()
        time.sleep(1.0)  # all started and connected
        began = time.monotonic()
        go.set()
        records = [r for _ in procs for r in out.get(timeout=600)]
        wall = time.monotonic() - began
        for p in procs:
            p.join(30)
        done = len(records)
        efficiency = done * HOLD / (wall * limit)
        longest = max(got - asked for asked, got in records)
        by_grant = sorted(records, key=lambda r: r[1])
        overtaken = []
        for i, (asked, _) in enumerate(by_grant):
            later_first = sum(1 for a, _ in by_grant[:i] if a > asked)
            overtaken.append(later_first)
        lines.append(
            f"| {label} | {limit} | {done} | {wall:.2f} s | {efficiency:.0%} | "
            f"{longest * 1000:.0f} ms | {statistics.mean(overtaken):.1f} / {max(overtaken)} |"
        )
    return lines


def _reader(urls: list[str], name: str, stop: Any, go: Any, out: Any) -> None:
    engine = Redlock(urls, retry_delay=0.05)
    go.wait()
    done = 0
    try:
        while not stop.is_set():
            try:
                with engine.lock(name, shared=True, ttl=10, wait=60):
                    time.sleep(HOLD)
                    done += 1
            except LockNotAcquired:
                pass
    finally:
        engine.close()
        out.put(done)


def readers(urls: Sequence[str], writes: int) -> list[str]:
    ctx = multiprocessing.get_context("fork")
    go, stop, out = ctx.Event(), ctx.Event(), ctx.Queue()
    name = "readers:prices"
    procs = [
        ctx.Process(target=_reader, args=(list(urls), name, stop, go, out))
        for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    time.sleep(1.0)
    engine = Redlock(list(urls), retry_delay=0.05)
    go.set()
    time.sleep(0.3)  # readers in full swing
    waits = []
    began = time.monotonic()
    try:
        for _ in range(writes):
            asked = time.monotonic()
            with engine.lock(name, ttl=10, wait=60):
                waits.append(time.monotonic() - asked)
                time.sleep(HOLD)
            time.sleep(0.05)
    finally:
        wall = time.monotonic() - began
        stop.set()
        reads = sum(out.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(30)
        engine.close()
    waits.sort()
    return [
        "| 16 readers (2 ms), 1 writer | writes | writer wait median | writer wait max | reads/s |",
        "|---|---|---|---|---|",
        f"| shared=True | {len(waits)} | {statistics.median(waits) * 1000:.1f} ms | "
        f"{waits[-1] * 1000:.1f} ms | {reads / wall:.0f} |",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.permits", description=__doc__)
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--sections", type=int, default=40)
    parser.add_argument("--writes", type=int, default=20)
    args = parser.parse_args(argv)
    with local_masters(5, Path(tempfile.mkdtemp(prefix="bench-permits-"))) as masters:
        urls = [m.url for m in masters]
        for lines in (
            cycle(urls, args.cycles),
            contention(urls, args.sections),
            readers(urls, args.writes),
        ):
            print("\n".join(lines) + "\n", flush=True)


if __name__ == "__main__":
    main()
