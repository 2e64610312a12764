"""``python -m bench.cluster``: lock cycles per second through ONE member, a plain master versus a
Redis Cluster of three shards, side by side, on distinct keys (``docs/deployment.md``, "Cluster
members").

Each run starts ``--processes`` client processes, each with ``--tasks`` asyncio tasks that
acquire and release a lock of their own (``{bench:<process>-<task>}``) for ``--seconds``, on a
Redlock whose only member is the plain master, then the cluster (interleaved ``--rounds``
times, so that machine noise hits both alike). Besides cycles per second it reads each server's
CPU (``INFO cpu``) before and after, less what it spends idle (measured just before): the Redis
CPU a cycle costs, and the busiest server's share of it. A member saturates when its busiest
server's CPU does: a cluster spreads the keys over its shards, so its ceiling grows with them
(less what cluster mode costs per command), once the clients can push that much (on a small
machine the client processes saturate first: compare the CPU columns).
``ceiling/s``: cycles per second at which the busiest server would use one whole core, from the
CPU it used per cycle (the arithmetic for a machine whose clients can push that far).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from collections.abc import Sequence
from typing import Any

import redis

from django_redlock.engine import Redlock
from django_redlock.testing.clusters import local_cluster
from django_redlock.testing.masters import local_masters


def _cpu(ports: Sequence[int]) -> list[float]:
    out = []
    for port in ports:
        info: Any = redis.Redis(port=port).info("cpu")
        out.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return out


async def _cycles(url: str, process: int, tasks: int, seconds: float) -> int:
    engine = Redlock([url], ttl=10, node_timeout=1.0)
    done = 0
    deadline = time.monotonic() + seconds

    async def one(task: int) -> None:
        nonlocal done
        lock = engine.lock(f"{{bench:{process}-{task}}}")
        while time.monotonic() < deadline:
            async with lock:
                pass
            done += 1

    await asyncio.gather(*(one(t) for t in range(tasks)))
    engine.close()
    return done


def _client(url: str, process: int, tasks: int, seconds: float, start: Any, out: Any) -> None:
    start.wait()
    out.put(asyncio.run(_cycles(url, process, tasks, seconds)))


#: Seconds of idle CPU measured before each run.
IDLE = 2.0


def measure(
    url: str, ports: Sequence[int], processes: int, tasks: int, seconds: float
) -> dict[str, float]:
    ctx = multiprocessing.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    workers = [
        ctx.Process(target=_client, args=(url, p, tasks, seconds, start, out))
        for p in range(processes)
    ]
    for worker in workers:
        worker.start()
    time.sleep(0.5)  # every process forked and waiting
    # What each server spends idle (its cron; a cluster's bus pings), subtracted below: at a
    # few thousand cycles a second it is a good part of a cluster's CPU.
    quiet = _cpu(ports)
    time.sleep(IDLE)
    before = _cpu(ports)
    idle = [(b - a) / IDLE for a, b in zip(quiet, before, strict=True)]
    began = time.monotonic()
    start.set()
    cycles = sum(out.get(timeout=seconds + 60) for _ in workers)
    elapsed = time.monotonic() - began
    after = _cpu(ports)
    spent = [max(b - a - i * elapsed, 0.0) for a, b, i in zip(before, after, idle, strict=True)]
    for worker in workers:
        worker.join()
    return {
        "cycles_per_s": cycles / elapsed,
        "redis_cpu_us_per_cycle": sum(spent) / cycles * 1e6,
        "busiest_server_cpu_share": max(spent) / elapsed,
        # The member's ceiling: its busiest server at 100% of one core, as much per cycle.
        "ceiling_cycles_per_s": cycles / max(spent) if max(spent) > 0 else float("inf"),
        "load_1min": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with local_masters(1) as (plain,), local_cluster() as cluster:
        members: dict[str, tuple[str, list[int]]] = {
            "plain master": (plain.url, [plain.port]),
            "cluster, 3 shards": (cluster.url, [s.port for s in cluster.shards]),
        }
        print(
            f"{args.processes} processes x {args.tasks} asyncio tasks, distinct keys, "
            f"{args.seconds:g} s a run, {os.cpu_count()} CPUs"
        )
        print(
            f"{'member':<20}{'cycles/s':>10}{'Redis us/cycle':>16}{'busiest CPU':>13}"
            f"{'ceiling/s':>11}{'load':>7}"
        )
        for _ in range(args.rounds):
            for name, (url, ports) in members.items():
                row = measure(url, ports, args.processes, args.tasks, args.seconds)
                print(
                    f"{name:<20}{row['cycles_per_s']:>10.0f}"
                    f"{row['redis_cpu_us_per_cycle']:>16.1f}"
                    f"{row['busiest_server_cpu_share']:>12.0%} "
                    f"{row['ceiling_cycles_per_s']:>10.0f}{row['load_1min']:>7.2f}"
                )


if __name__ == "__main__":
    main()
