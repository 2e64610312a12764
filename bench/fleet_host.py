"""One process of ``bench.fleet``: ``python -m bench.fleet_host <role> ...``.

- ``cron <T0> <period> <slots> <at_least|-> <log>``: a host's cron: at T0 + k*period by *this
  process's* wall clock (run under the clock shim, it is offset), run a 0.2-2 s job under the
  lock "fleet:cron" (skip when held); log "<slot> <pid>" per run.
- ``leader <log>``: lead "fleet" (ttl 1 s) until killed; log "start <pid> <t>" on taking over,
  then "beat <pid> <t>" every 10 ms (t: wall clock, one machine).
- ``enqueue <ours|once|mixed> <calls> <go file>``: wait for the go file, then enqueue the bench
  task ``calls`` times for one key (mixed: delay(), a countdown, a group of two by turns); print
  one JSON line: ids returned, AlreadyQueued raised, seconds.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import django


def cron(t0: float, period: float, slots: int, at_least: float | None, log: str) -> None:
    from django_redlock import redlock
    from django_redlock.engine import LockContended

    django.setup()
    rng = random.Random(os.getpid())
    for slot in range(slots):
        while (left := t0 + slot * period - time.time()) > 0:
            time.sleep(min(left, 0.02))
        try:
            with redlock("fleet:cron", ttl=10, at_least=at_least):
                with open(log, "a") as out:
                    out.write(f"{slot} {os.getpid()}\n")
                time.sleep(rng.uniform(0.2, 2.0))
        except LockContended:
            pass


def leader(log: str) -> None:
    from django_redlock import leader as lead

    django.setup()
    with lead("fleet", ttl=1.0) as leadership, open(log, "a", buffering=1) as out:
        out.write(f"start {os.getpid()} {time.time():.6f}\n")
        while not leadership.lost.is_set():
            out.write(f"beat {os.getpid()} {time.time():.6f}\n")
            time.sleep(0.01)


def enqueue(kind: str, calls: int, go: str) -> None:
    """``kind``: "ours" or "once" (``delay()`` of a 3 s task each time), or "mixed" (a 0.5 s
    task, ours with a 1 s queue timeout, by turns: ``apply_async(countdown=3)``, ``delay()``
    and a group of the task twice: the countdown outlives the queue timeout)."""
    from celery import group
    from celery_once import AlreadyQueued

    from bench import fleet_tasks
    from django_redlock.contrib.celery import AlreadyQueued as OursAlreadyQueued
    from django_redlock.engine import QuorumUnavailable

    tasks = {"once": fleet_tasks.once, "ours": fleet_tasks.ours}
    task = tasks.get(kind, fleet_tasks.ours_brief_queue)
    task.delay  # noqa: B018 (builds the task before the clock starts)
    Path(f"{go}.{os.getpid()}").touch()  # ready
    while not Path(go).exists():
        time.sleep(0.005)
    seconds = 0.5 if kind == "mixed" else 3.0  # mixed: a short task, done before the next call
    ids: dict[str, int] = {}
    already = unavailable = 0
    began = time.perf_counter()
    for call in range(calls):
        turn = call % 3 if kind == "mixed" else 1
        try:
            if turn == 0:  # every process's first call: the task that wins starts 3 s ahead
                result = task.apply_async((1, seconds), countdown=3.0)
            elif turn == 1:
                result = task.delay(1, seconds)
            else:
                result = group(task.s(1, seconds), task.s(1, seconds)).apply_async()
        except (AlreadyQueued, OursAlreadyQueued):
            already += 1
            continue
        except QuorumUnavailable:  # too few masters answered in time (a loaded machine)
            unavailable += 1
            continue
        ids[result.id] = ids.get(result.id, 0) + 1
    took = time.perf_counter() - began
    print(
        json.dumps(
            {"ids": ids, "already_queued": already, "unavailable": unavailable, "seconds": took}
        ),
        flush=True,
    )


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "cron":
        cron(
            float(args[0]),
            float(args[1]),
            int(args[2]),
            None if args[3] == "-" else float(args[3]),
            args[4],
        )
    elif role == "leader":
        leader(args[0])
    elif role == "enqueue":
        enqueue(args[0], int(args[1]), args[2])
    else:
        raise SystemExit(f"unknown role {role!r}")
