"""``python -m bench profile``: where an uncontended acquire+release of ours spends its time,
next to the floor, on 5 local masters. Not part of ``all``: it prints, it saves nothing.

1. Client CPU time per cycle of each (floor, ours sync, floor asyncio, ours async), in short
   interleaved rounds: the client's own work, without the wait for the masters.
2. cProfile over many cycles of each (floor, ours sync, floor asyncio, ours async): the top
   functions by own time, in microseconds and calls per cycle. cProfile slows every Python call
   down, so read the shares and call counts, not the absolute times.
3. What the engine's pure steps cost on their own (timeit, no I/O): the work ours does per cycle
   that the floor does not.

For a sampling view without cProfile's overhead, run ``py-spy record -r 1000 -o out.svg --
python -m bench a`` (py-spy is not a dependency).
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

from django_redlock.engine import Redlock
from django_redlock.engine.algorithm.steps import vote
from django_redlock.engine.base import protocol
from django_redlock.engine.base.values import make_value
from django_redlock.engine.leases.leases import current_owner
from django_redlock.engine.members.packing import pack
from django_redlock.engine.running.drivers import fan_out
from django_redlock.testing.masters import local_masters

from .cycle import TTL, AsyncFloor, Floor, Ours, OursAsync, OursWith, addresses, load_scripts
from .django_layer import OursDjango, OursDjangoAsync
from .peers import Contender

CYCLES = 2000
TOP = 14


def main() -> None:
    with local_masters(5) as masters:
        load_scripts(masters)
        addrs = addresses(masters)
        urls = [m.url for m in masters]
        floor = Floor(addrs, "bench:profile:floor")
        ours = Ours(urls, "bench:profile:ours")
        afloor = AsyncFloor(addrs, "bench:profile:floor-async")
        aours = OursAsync(urls, "bench:profile:ours-async")
        contenders: list[tuple[str, Contender]] = [
            ("floor", floor),
            ("ours (sync)", ours),
            ("ours (sync, with)", OursWith(urls, "bench:profile:ours-with")),
            ("ours (redlock(), Django)", OursDjango(urls, "bench:profile:django")),
            ("floor (asyncio)", afloor),
            ("ours (async)", aours),
            ("ours (redlock(), Django, async)", OursDjangoAsync(urls, "bench:profile:django-a")),
        ]
        for _, contender in contenders:
            contender.run(200)  # warm
        cpu_per_cycle(contenders)
        for name, contender in contenders:
            profiled(name, functools.partial(contender.run, CYCLES))
            contender.close()
        pure_steps(urls)


def cpu_per_cycle(
    contenders: list[tuple[str, Contender]], rounds: int = 25, cycles: int = 300
) -> None:
    """This process's CPU time per cycle (``time.process_time``): the client-side work of each,
    without the wait for the masters. Many short interleaved rounds, each row compared with the
    floor of the same round (the median of those ratios), because on a shared virtual machine
    CPU time is disturbed too (stolen time counts as ours), in bursts of seconds."""
    per: dict[str, list[float]] = {name: [] for name, _ in contenders}
    for r in range(rounds):
        shift = r % len(contenders)
        for name, contender in contenders[shift:] + contenders[:shift]:
            start = time.process_time()
            contender.run(cycles)
            per[name].append((time.process_time() - start) / cycles)
    floor = per[contenders[0][0]]
    print("\n### client CPU per cycle (process_time; median of rounds, ratio per round)\n")
    print("| implementation | CPU us per cycle | x floor (same round) |")
    print("|---|---|---|")
    for name, times in per.items():
        ratio = statistics.median(t / f for t, f in zip(times, floor, strict=True))
        print(f"| {name} | {statistics.median(times) * 1e6:.1f} | {ratio:.2f}x |")


def profiled(name: str, work: Callable[[], object]) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    work()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"\n### {name}: {total / CYCLES * 1e6:.1f} us per cycle under cProfile\n")
    print("| own us/cycle | share | calls/cycle | function |")
    print("|---|---|---|---|")
    entries: Any = stats.stats  # type: ignore[attr-defined]
    rows = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)[:TOP]
    for (path, line, func), (_, calls, tottime, _, _) in rows:
        where = path.split("site-packages/")[-1].split("/work/main/")[-1]
        print(
            f"| {tottime / CYCLES * 1e6:.1f} | {tottime / total:.0%} | {calls / CYCLES:.1f} | "
            f"`{func}` {where}:{line} |"
        )


def pure_steps(urls: list[str]) -> None:
    """The engine's per-cycle work that involves no I/O, each step timed alone."""
    redlock = Redlock(urls)
    lock = redlock.lock("bench:profile:pure", ttl=TTL)
    value = make_value(None, TTL, None)
    granted = [b"OK"] * 5
    command = ("SET", lock.key, value, "NX", "PX", 10_000)
    steps: list[tuple[str, Callable[[], object]]] = [
        ("make_value() (token + owner JSON)", lambda: make_value(None, TTL, None)),
        ("current_owner() (called 2x per cycle)", current_owner),
        ("redlock.lock(r) (a new Lock object)", lambda: redlock.lock("bench:profile:x")),
        ("pack(SET ...) once per round", lambda: pack(command)),
        (
            "release_command(r, value)",
            lambda: redlock.release_command(lock.resources, value),
        ),
        (
            "tally of 5 votes (vote() x5 + protocol.tally)",
            lambda: protocol.tally(
                [vote(r) for r in granted], ttl=TTL, elapsed=0.0002, drift_factor=0.01
            ),
        ),
        ("the threads' pipe of each master x5", lambda: [n.pipe for n in redlock.nodes]),
    ]
    print("\n### ours: pure steps per cycle (timeit, no I/O)\n")
    print("| us per call | step |")
    print("|---|---|")
    for label, step in steps:
        n, took = timeit.Timer(step).autorange()
        best = min(timeit.Timer(step).repeat(5, n)) / n
        print(f"| {best * 1e6:.2f} | {label} |")
    round_overhead(redlock)
    redlock.close()


def round_overhead(redlock: Redlock, rounds: int = 3000) -> None:
    """One round through ``fan_out`` against the same round written by hand on redis-py
    connections to the same masters (send to all, read all, no deadline, no pool; as the floor
    does), interleaved: what the fan-out's budget, pool and bookkeeping cost per round on real
    sockets, net of the I/O layer it replaces."""
    command = ("GET", "bench:profile:missing")
    fan_out(redlock.nodes, command, redlock.node_timeout)  # connect
    conns = []
    for node in redlock.nodes:
        conn = node.spec.connection_class(**node.spec.connection_kwargs)
        conn.connect()
        conns.append(conn)
    packed = pack(command)
    clock = time.perf_counter_ns
    raw_ns: list[int] = []
    ours_ns: list[int] = []
    for _ in range(rounds):
        start = clock()
        for conn in conns:
            conn.send_packed_command([packed], check_health=False)
        for conn in conns:
            conn.read_response()
        raw_ns.append(clock() - start)
        start = clock()
        fan_out(redlock.nodes, command, redlock.node_timeout)
        ours_ns.append(clock() - start)
    for conn in conns:
        conn.disconnect()
    raw, ours = statistics.median(raw_ns) / 1000, statistics.median(ours_ns) / 1000
    print("\n### one round on 5 masters: fan_out vs the same round by hand (real I/O)\n")
    print(f"by hand {raw:.1f} us, fan_out {ours:.1f} us: {ours - raw:+.1f} us per round (median)")
