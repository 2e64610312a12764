"""What the DB guard costs per query (issue 19; target: at most 2 us, no I/O).

    .venv/bin/python -m bench.dbguard [--queries 20000] [--rounds 15]

One Django connection to an in-memory SQLite database runs ``SELECT 1`` through Django's cursor
in three configurations, interleaved in rounds (so that load from elsewhere hits all alike):

- **bare**: no execute wrapper at all (a project without django_redlock);
- **guard, no block**: the guard installed, no guarded block around the query (every query of a
  project that has the app, outside locks);
- **guard, in a block**: inside ``with redlock(...)``, one held lease checked per query;
- **a no-op wrapper**: a wrapper that only calls on, in place of the guard: what Django's
  ``execute_wrappers`` machinery itself costs (the guard's own work is the rest).

The figure is the best per-query time over the rounds (the least disturbed by other load) and
the difference to bare; then the guard's wrapper alone, called directly without SQLite or
Django's cursor, which is far less noisy. The
lock's masters are 5 real local redis-servers; the guard makes no request to them.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import django
from django.conf import settings

from django_redlock.testing.masters import local_masters


def per_query(cursor_execute: Callable[[str], object], queries: int) -> float:
    gc.collect()
    gc.disable()  # a collection triggered by another run's garbage must not land in this one
    try:
        started = time.perf_counter_ns()
        for _ in range(queries):
            cursor_execute("SELECT 1")
        return (time.perf_counter_ns() - started) / queries / 1000.0  # microseconds
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dbguard", description=__doc__)
    parser.add_argument("--queries", type=int, default=20_000, help="queries per run (20000)")
    parser.add_argument("--rounds", type=int, default=15, help="rounds (15)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp, local_masters(5, Path(tmp)) as masters:
        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            REDLOCK={"NODES": [m.url for m in masters]},
        )
        django.setup()
        from django.db import connection

        from django_redlock import dbguard, redlock
        from django_redlock.dbguard import install, refuse_stale_queries

        cursor = connection.cursor()
        results: dict[str, list[float]] = {
            "bare": [],
            "guard, no block": [],
            "in a block": [],
            "a no-op wrapper": [],
        }

        def bare() -> float:
            connection.execute_wrappers.remove(refuse_stale_queries)
            try:
                return per_query(cursor.execute, args.queries)
            finally:
                install(connection)

        def unguarded() -> float:
            return per_query(cursor.execute, args.queries)

        def guarded() -> float:
            with redlock("bench:dbguard", ttl=60):
                return per_query(cursor.execute, args.queries)

        def noop(execute: Callable[..., object], *call: object) -> object:
            return execute(*call)

        def noop_wrapper() -> float:
            connection.execute_wrappers[0] = noop
            try:
                return per_query(cursor.execute, args.queries)
            finally:
                connection.execute_wrappers[0] = refuse_stale_queries

        install(connection)
        runs = [
            ("bare", bare),
            ("guard, no block", unguarded),
            ("in a block", guarded),
            ("a no-op wrapper", noop_wrapper),
        ]
        for _name, run in runs:  # warm-up
            run()
        for r in range(args.rounds):
            for name, run in runs[r % len(runs) :] + runs[: r % len(runs)]:
                results[name].append(run())
        base = min(results["bare"])
        # What entering and leaving a guarded block adds to the lock's own cycle (no I/O).
        with redlock("bench:dbguard:entry", ttl=60) as held:
            lease = held._callers.get(threading.current_thread())  # noqa: SLF001
            assert lease is not None
            entries = []
            for _ in range(args.rounds):
                started = time.perf_counter_ns()
                for _ in range(args.queries):
                    dbguard.install_here()
                    dbguard.guard(lease)
                    dbguard.unguard(lease)
                entries.append((time.perf_counter_ns() - started) / args.queries / 1000.0)
        print(f"DB guard, per query (best of {args.rounds} rounds x {args.queries} queries):")
        for name, times in results.items():
            best = min(times)
            print(f"  {name:16} {best:6.2f} us/query  (+{best - base:.2f} us over bare)")
        print(f"  entering + leaving a guarded block: {min(entries):.2f} us (best of rounds)")

        # The guard's own work, called directly (no SQLite, no Django cursor): far less noisy.
        def execute(*call: object) -> None:
            return None

        context: dict[str, object] = {}

        def direct(wrapper: Callable[..., object]) -> float:
            started = time.perf_counter_ns()
            for _ in range(args.queries):
                wrapper(execute, "SELECT 1", None, False, context)
            return (time.perf_counter_ns() - started) / args.queries / 1000.0

        calls: dict[str, list[float]] = {"no-op": [], "guard, no block": [], "in a block": []}
        for _ in range(args.rounds):
            calls["no-op"].append(direct(noop))
            calls["guard, no block"].append(direct(refuse_stale_queries))
            with redlock("bench:dbguard:direct", ttl=60):
                calls["in a block"].append(direct(refuse_stale_queries))
        print("  the wrapper alone, called directly (best of rounds):")
        for name, times in calls.items():
            print(f"    {name:16} {min(times):6.3f} us/call")


if __name__ == "__main__":
    main()
