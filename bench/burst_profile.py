"""``python -m bench.burst_profile [--baseline DIR] [--runs 3] [--callgrind]``: where a burst of
(f) spends its time, ours now and (with ``--baseline``) the code in DIR (e.g. ``git worktree add
/tmp/base main``), measured the same way, side by side. Not part of ``all``: it prints, it saves
nothing.

The burst is (f)'s: ``--tasks`` asyncio tasks at once in one fresh process, each one attempt
(``wait=0``) at a key of its own on 5 local masters, held 20 ms, released; ``cold`` is the
engine's first use in that process (connects included), ``warm`` its second burst. Per run and
code, one process each, the codes taking turns (the order swapped every run), ``uptime`` with
every line:

1. latency (asking to holding: p50, p99, max); the process's CPU time used by the moment the
   p99 acquisition held (how much of our own work it waited behind, less sensitive to what else
   the machine runs than its wall time), and the 99th percentile of the CPU time the process
   used while each acquisition waited (asking to holding: what a latency is made of when the
   process is busy all along, as in a burst); wall time and the process's CPU time per burst,
   and the garbage collector's share of it (collections by generation, and their time);
2. with ``--profile``: cProfile over the warm burst: Python function calls per acquisition +
   release (a load-independent count), and the top functions by own time; with ``--sample``,
   where the warm burst's time goes without cProfile's distortion (``Sampler``);
3. with ``--window`` (valgrind on PATH): the instructions from the last acquisition's asking to
   the 99th-percentile acquisition's holding, cold and warm (the work the p99 acquisition waited
   behind; load-independent, to within a garbage collection or two), ``--runs`` times; the hold
   and the engine's holder patience are scaled by SLOWER there, the node budget is 4 s and the
   TTL 120 s;
4. with ``--callgrind`` (valgrind on PATH): instructions per acquisition + release in the warm
   burst, load-independent: Ir(cold + warm) - Ir(cold), over ``--tasks``. Under valgrind the
   process runs ~50x slower: the node budget is 4 s and the TTL 120 s there (else leases run
   out before their release, and the failures' path is measured instead).

Run by path (``python bench/burst_profile.py child <json>``), the measured process imports only
the standard library and the ``django_redlock`` that ``PYTHONPATH`` names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent
TASKS = 1000
HOLD = 0.02
#: Warm bursts sampled (``--sample``), summed.
SAMPLED = 8
#: How much slower a process runs under valgrind (``--window``): the hold and the engine's holder
#: patience are scaled by it there, so that releases and acquisitions meet as they do outside.
SLOWER = 50


# --- the measured process -----------------------------------------------------------------------


def child(config: dict[str, Any]) -> None:
    import asyncio
    import cProfile
    import gc
    import io
    import pstats

    from django_redlock.engine import Redlock

    collections = {0: [0, 0.0], 1: [0, 0.0], 2: [0, 0.0]}
    started = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            entry = collections[info["generation"]]
            entry[0] += 1
            entry[1] += time.perf_counter() - started[0]

    gc.callbacks.append(on_gc)
    engine = Redlock(config["urls"], node_timeout=config["timeout"])
    tasks, hold = config["tasks"], config["hold"]
    marks = config.get("marks", False)
    if marks:  # (``--window``: under valgrind, the engine's time constants scaled as the process)
        from django_redlock.engine.waiting import admission

        admission.HOLDER_PATIENCE *= SLOWER
        hold *= SLOWER

    async def burst(prefix: str) -> dict[str, Any]:
        latencies: list[int] = []
        # The process's CPU time used since the burst began, when each acquisition held: how
        # much of our own work the p99 one waited behind, whatever else the machine ran.
        cpu_at: list[float] = []
        # The process's CPU time used while each acquisition waited (asking to holding): the
        # work its latency is made of, whatever else the machine ran meanwhile.
        cpu_waited: list[float] = []
        failures: dict[str, Any] = {}
        clock = time.perf_counter_ns

        async def one(key: str, last: bool = False) -> None:
            if last and marks:
                os.getppid()  # (a mark for callgrind: the last acquisition asks)
            start = clock()
            start_cpu = time.process_time()
            got = 0
            try:
                async with engine.lock(key, ttl=config["ttl"], wait=0):
                    got = clock()
                    latencies.append(got - start)
                    cpu_at.append(time.process_time())
                    cpu_waited.append(cpu_at[-1] - start_cpu)
                    if marks and len(latencies) == int(0.99 * tasks):
                        os.getppid()  # (the 99th-percentile acquisition holds)
                    await asyncio.sleep(hold)
            except Exception as exc:  # noqa: BLE001 (a failure is a result to report)
                kind = f"{type(exc).__name__}{' (release)' if got else ''}"
                failures.setdefault(kind, [0, str(exc)[:160]])[0] += 1

        for entry in collections.values():
            entry[:] = [0, 0.0]
        began_cpu, start = time.process_time(), clock()
        await asyncio.gather(*(one(f"{prefix}{i}", i == tasks - 1) for i in range(tasks)))
        wall, cpu = clock() - start, time.process_time() - began_cpu
        latencies.sort()
        cpu_at.sort()
        cpu_waited.sort()

        def at(q: float) -> float | None:
            return latencies[min(len(latencies) - 1, int(q * len(latencies)))] / 1e6

        return {
            "acquired": len(latencies),
            "p50_ms": at(0.5) if latencies else None,
            "p99_ms": at(0.99) if latencies else None,
            "p99_cpu_ms": (cpu_at[int(0.99 * len(cpu_at))] - began_cpu) * 1e3 if cpu_at else None,
            "p99_cpu_waited_ms": cpu_waited[int(0.99 * len(cpu_waited))] * 1e3
            if cpu_waited
            else None,
            "max_ms": latencies[-1] / 1e6 if latencies else None,
            "wall_ms": wall / 1e6,
            "cpu_ms": cpu * 1e3,
            "gc": {g: (n, round(t * 1e3, 1)) for g, (n, t) in collections.items()},
            "failures": failures,
        }

    async def main() -> list[dict[str, Any]]:
        out = []
        for phase in config["phases"]:
            profiler = cProfile.Profile() if config.get("profile") == phase else None
            if profiler is not None:
                profiler.enable()
            sampler = Sampler(on_gc) if config.get("sample") == phase else None
            result = await burst(f"bench:burst-profile:{os.getpid()}:{phase}:")
            if sampler is not None:
                result["samples"] = sampler.stop()
            if profiler is not None:
                profiler.disable()
                stats = pstats.Stats(profiler)
                entries: Any = stats.stats  # type: ignore[attr-defined]
                result["calls_per_op"] = sum(e[1] for e in entries.values()) / tasks
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                result["top"] = text.getvalue()
            out.append({"phase": phase, **result})
        engine.close()
        return out

    print(json.dumps(asyncio.run(main())))


class Sampler:
    """Where the process's CPU time goes: every 0.5 ms of it (``ITIMER_PROF``), a signal handler
    in the main thread looks at the Python frame running, and counts the sample by the innermost
    frame's module (an engine module, asyncio, the collector, the benchmark's own code) and by
    the outermost engine function (the stage: acquiring, releasing, reading replies). A C call
    (a system call, a collection) is counted to the frame that made it, once it returns: a
    collection, to the collector (its callback is the first Python code that runs after it).
    Sampling, not tracing: no function call is slowed down."""

    def __init__(self, gc_callback: Any) -> None:
        import signal

        self._gc_code = gc_callback.__code__
        self.where: dict[str, int] = {}
        self.stage: dict[str, int] = {}
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, 0.0005, 0.0005)

    def _sample(self, signum: int, frame: Any) -> None:
        if frame is None:
            return
        if frame.f_code is self._gc_code:
            inner = "garbage collector"
        else:
            inner = f"{_module(frame.f_code.co_filename)}: {frame.f_code.co_name}"
        outer = "outside the engine"
        while frame is not None:
            if "/django_redlock/" in frame.f_code.co_filename:
                outer = f"{_module(frame.f_code.co_filename)}: {frame.f_code.co_name}"
            frame = frame.f_back
        self.where[inner] = self.where.get(inner, 0) + 1
        self.stage[outer] = self.stage.get(outer, 0) + 1

    def stop(self) -> dict[str, dict[str, int]]:
        import signal

        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        signal.signal(signal.SIGPROF, signal.SIG_DFL)
        return {"where": self.where, "stage": self.stage}


def _module(path: str) -> str:
    if "/django_redlock/" in path:
        return "engine/" + path.rsplit("/", 1)[-1] if "/engine/" in path else path
    if "/asyncio/" in path:
        return "asyncio"
    return "this benchmark" if path == str(HERE) else path.rsplit("/", 1)[-1]


# --- the comparison -----------------------------------------------------------------------------


def uptime() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measured(code: Path, config: dict[str, Any], prefix: list[str] = ()) -> tuple[Any, str]:  # type: ignore[assignment]
    env = dict(os.environ, PYTHONPATH=str(code), PYTHONHASHSEED="0")
    command = [*prefix, sys.executable, str(HERE), "child", json.dumps(config)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, cwd="/", check=False)
    if done.returncode:
        raise RuntimeError(f"{code}: {done.stderr[-2000:]}")
    return json.loads(done.stdout), done.stderr


def instructions(code: Path, config: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Instructions per acquisition + release of the warm burst (callgrind)."""
    totals = []
    warm: dict[str, Any] = {}
    for phases in (["cold"], ["cold", "warm"]):
        run = {**config, "phases": phases, "timeout": 4.0, "ttl": 120.0}
        results, stderr = measured(
            code, run, ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
        )
        totals.append(int(re.search(r"Collected : (\d+)", stderr).group(1)))  # type: ignore[union-attr]
        warm = results[-1]
    return (totals[1] - totals[0]) / config["tasks"], warm


def window(code: Path, config: dict[str, Any]) -> list[int]:
    """Instructions (callgrind) from the last acquisition's asking to the 99th-percentile
    acquisition's holding, per burst (cold, warm): the work the p99 acquisition waited behind,
    whatever else the machine runs. The child marks both moments with a system call
    (``getppid``) that callgrind dumps its counts before."""
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        run = {**config, "phases": ["cold", "warm"], "timeout": 4.0, "ttl": 120.0, "marks": True}
        out = f"{folder}/callgrind.out"
        prefix = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        measured(code, run, [*prefix, "--dump-before=getppid"])
        parts = sorted(Path(folder).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        totals = []
        for part in parts:
            found = re.search(r"^(?:summary|totals): (\d+)", part.read_text(), re.MULTILINE)
            totals.append(int(found.group(1)) if found else 0)
        return totals[1::2][:2]  # (the parts between the marks: each burst's window)


def main() -> None:
    import argparse

    from django_redlock.testing.masters import local_masters

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=TASKS)
    parser.add_argument("--profile", action="store_true", help="cProfile the warm burst")
    parser.add_argument("--callgrind", action="store_true", help="instructions (valgrind)")
    parser.add_argument("--sample", action="store_true", help="where the warm burst's time goes")
    parser.add_argument(
        "--window", action="store_true", help="instructions the p99 acquisition waited behind"
    )
    args = parser.parse_args()
    codes = {"ours": ROOT}
    if args.baseline is not None:
        codes = {"baseline": args.baseline.resolve(), **codes}
    with local_masters(5) as masters:
        config = {"urls": [m.url for m in masters], "tasks": args.tasks, "hold": HOLD}
        config |= {"timeout": 0.05, "ttl": 10.0}
        print(f"{args.tasks} tasks at once, 5 masters; uptime before: {uptime()}")
        headers = "code|run|burst|acquired|p50 ms|p99 ms|max ms|CPU ms at p99|p99 CPU ms waited"
        headers += "|wall ms|CPU ms"
        headers += "|CPU us per op"
        headers += "|GC collections (gen 0/1/2)|GC ms|failures|uptime"
        print(f"| {headers.replace('|', ' | ')} |")
        print("|---" * 16 + "|")
        for run in range(args.runs):
            for name, code in list(codes.items())[:: 1 if run % 2 == 0 else -1]:
                results, _ = measured(code, {**config, "phases": ["cold", "warm"]})
                for r in results:
                    gcs = "/".join(str(r["gc"][g][0]) for g in "012")
                    gc_ms = sum(r["gc"][g][1] for g in "012")
                    failures = ", ".join(f"{n} x {k}" for k, (n, _) in r["failures"].items())
                    print(f"| {name} | {run + 1} | {r['phase']} | {r['acquired']} | "
                          f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_ms']:.0f} | "
                          f"{r.get('p99_cpu_ms') or 0:.0f} | "
                          f"{r.get('p99_cpu_waited_ms') or 0:.0f} | "
                          f"{r['wall_ms']:.0f} | {r['cpu_ms']:.0f} | "
                          f"{r['cpu_ms'] * 1000 / args.tasks:.0f} | {gcs} | {gc_ms:.0f} | "
                          f"{failures or 'none'} | {uptime()} |")  # fmt: skip
        if args.profile:
            for name, code in codes.items():
                results, _ = measured(
                    code, {**config, "phases": ["cold", "warm"], "profile": "warm"}
                )
                print(f"\n### {name}: {results[-1]['calls_per_op']:.0f} Python function calls "
                      "per acquisition + release (cProfile, warm burst)\n")  # fmt: skip
                print(results[-1]["top"])
        if args.sample:
            for name, code in codes.items():
                phases = ["cold", *["warm"] * SAMPLED]  # (a sample per kernel tick: ~4 ms)
                results, _ = measured(code, {**config, "phases": phases, "sample": "warm"})
                samples: dict[str, dict[str, int]] = {"where": {}, "stage": {}}
                for result in results[1:]:
                    for what, counts in result["samples"].items():
                        for key, n in counts.items():
                            samples[what][key] = samples[what].get(key, 0) + n
                for what, counts in samples.items():
                    total = sum(counts.values())
                    title = (
                        "innermost frame" if what == "where" else "stage (outermost engine call)"
                    )
                    print(f"\n### {name}: where warm bursts' time goes, by {title} "
                          f"({total} samples)\n")  # fmt: skip
                    print("| share | where |\n|---|---|")
                    for key, n in sorted(counts.items(), key=lambda item: -item[1])[:24]:
                        print(f"| {n / total:.0%} | {key} |")
        if args.window:
            for run in range(args.runs):
                for name, code in list(codes.items())[:: 1 if run % 2 == 0 else -1]:
                    cold_ir, warm_ir = window(code, config)
                    print(f"{name} (run {run + 1}): {cold_ir / 1e6:.0f} M instructions cold, "
                          f"{warm_ir / 1e6:.0f} M warm, from the last acquisition's asking to the "
                          "99th-percentile acquisition's holding (callgrind)")  # fmt: skip
        if args.callgrind:
            for name, code in codes.items():
                per_op, warm = instructions(code, config)
                failures = ", ".join(f"{n} x {k}" for k, (n, _) in warm["failures"].items())
                print(f"{name}: {per_op / 1000:.0f} k instructions per acquisition + release "
                      f"(callgrind, warm burst; failures: {failures or 'none'})")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1:2] == ["child"]:
        # Run by path: bench/ is first on sys.path, and its profile.py would shadow cProfile's.
        sys.path.remove(str(HERE.parent))
        child(json.loads(sys.argv[2]))
    else:
        main()
