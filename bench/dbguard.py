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

The figure is the median per-query time of each round's run and the difference to bare. The
lock's masters are 5 real local redis-servers; the guard makes no request to them.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import django
from django.conf import settings

from django_redlock.testing.masters import local_masters


def per_query(cursor_execute: Callable[[str], object], queries: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(queries):
        cursor_execute("SELECT 1")
    return (time.perf_counter_ns() - started) / queries / 1000.0  # microseconds


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

        from django_redlock import redlock
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
        base = statistics.median(results["bare"])
        print(f"DB guard, per query (median of {args.rounds} rounds x {args.queries} queries):")
        for name, times in results.items():
            median = statistics.median(times)
            print(f"  {name:16} {median:6.2f} us/query  (+{median - base:.2f} us over bare)")


if __name__ == "__main__":
    main()
