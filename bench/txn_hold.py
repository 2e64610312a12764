"""``python -m bench.txn_hold``: what holding a lock until its transaction ends costs (issue 33).

On SQLite (a file) and on PostgreSQL (a throwaway cluster, ``tests/postgres.py``), 5 local
masters, each database in a process of its own (Django settings are configured once per
process):

- **hold added**: ``with transaction.atomic(): with redlock(r): UPDATE`` — from the end of the
  lock's block to the start of its release round (right after ``COMMIT``), per cycle: the time
  the lock is held longer than before, median and p99. With ``release_before_commit=True`` the
  release starts at the block's end (the "before" row).
- **hot key through lock_view under ATOMIC_REQUESTS**: ``THREADS`` threads each posting
  ``POSTS`` times (Django's test client) to a ``lock_view(wait=30)`` view that reads a counter
  and writes it +1; before (``release_before_commit=True``, the old behaviour) and after (the
  default): holds/s, hand-offs/s (a hold by another thread than the one before), the share of
  the wall time a view was running under the lock, and the updates lost.

Not part of ``all``: it prints, it saves nothing. Needs PostgreSQL's binaries for its rows
(``apt-get install postgresql``); without them it says so and measures SQLite only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CYCLES = 300
THREADS, POSTS = 6, 20
RESOURCE = "bench:txn"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.txn_hold", description=__doc__)
    parser.add_argument("--cycles", type=int, default=CYCLES)
    parser.add_argument("--posts", type=int, default=POSTS, help="per thread")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--urls", help=argparse.SUPPRESS)
    parser.add_argument("--database", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.database, args.urls.split(","), args.cycles, args.posts)
        return

    from django_redlock.testing.masters import local_masters

    print(
        f"### held until the transaction ends ({args.cycles} cycles; {THREADS} threads x "
        f"{args.posts} posts; 5 masters)\n"
    )
    with local_masters(5) as masters, tempfile.TemporaryDirectory() as tmp:
        urls = ",".join(m.url for m in masters)
        _run("sqlite", str(Path(tmp) / "bench.sqlite3"), urls, args)
        try:
            from tests.postgres import throwaway_postgres

            with throwaway_postgres() as port:
                _run("postgresql", str(port), urls, args)
        except BaseException as exc:  # pytest.skip's exception when the binaries are missing
            if isinstance(exc, KeyboardInterrupt):
                raise
            print(f"postgresql: not measured ({type(exc).__name__}: {exc})")


def _run(kind: str, database: str, urls: str, args: argparse.Namespace) -> None:
    command = [
        sys.executable, "-m", "bench.txn_hold", "--child", kind, "--database", database,
        "--urls", urls, "--cycles", str(args.cycles), "--posts", str(args.posts),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=ROOT, env=env, text=True, capture_output=True)  # noqa: S603
    print(result.stdout, end="")
    if result.returncode:
        print(f"{kind}: failed\n{result.stderr[-3000:]}")


# --- the measuring process -----------------------------------------------------------------------


def _configure(kind: str, database: str, urls: list[str]) -> None:
    import django
    from django.conf import settings

    if kind == "sqlite":
        db = {"ENGINE": "django.db.backends.sqlite3", "NAME": database}
    else:
        db = {
            "ENGINE": "django.db.backends.postgresql", "NAME": "postgres", "USER": "postgres",
            "HOST": "127.0.0.1", "PORT": database,
        }  # fmt: skip
    settings.configure(
        INSTALLED_APPS=["django_redlock"],
        DATABASES={"default": db},
        REDLOCK={"NODES": urls, "TTL": 10.0, "NODE_TIMEOUT": 1.0},  # (a loaded machine)
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["testserver"],
        LOGGING_CONFIG=None,
    )
    django.setup()


def _child(kind: str, database: str, urls: list[str], cycles: int, posts: int) -> None:
    _configure(kind, database, urls)
    from django.db import connection

    urlpatterns[:] = _views()

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE IF NOT EXISTS bench_counter (id INTEGER PRIMARY KEY, value INTEGER)"
        )
        cursor.execute("DELETE FROM bench_counter")
        cursor.execute("INSERT INTO bench_counter (id, value) VALUES (1, 0)")
    for early in (True, False):
        added = _hold_added(cycles, early)
        label = "release_before_commit=True (before)" if early else "held until COMMIT (after)"
        print(
            f"{kind:10} hold added, {label:38} median {_ms(statistics.median(added))}  "
            f"p99 {_ms(_p99(added))}"
        )
    for early in (True, False):
        label = "release_before_commit=True (before)" if early else "held until COMMIT (after)"
        print(f"{kind:10} lock_view hot key, {label:31} {_hot_key(posts, early)}")
    connection.close()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:7.3f} ms"


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _hold_added(cycles: int, early: bool) -> list[float]:
    """Per cycle: the start of the release round minus the end of the lock's block."""
    from django.db import connection, transaction

    from django_redlock import redlock
    from django_redlock.locks import DjangoLock

    starts: list[float] = []
    waited = DjangoLock._release_waited
    plain = DjangoLock._release

    def release_waited(self: DjangoLock, owner: Any, lease: Any) -> None:
        starts.append(time.monotonic())
        waited(self, owner, lease)

    def release(self: DjangoLock, owner: Any) -> None:
        if self._layer.release_before_commit:
            starts.append(time.monotonic())
        plain(self, owner)

    DjangoLock._release_waited = release_waited  # type: ignore[method-assign]
    DjangoLock._release = release  # type: ignore[method-assign]
    added = []
    try:
        for _ in range(cycles + 20):
            with transaction.atomic():
                with redlock(RESOURCE, release_before_commit=early):
                    with connection.cursor() as cursor:
                        cursor.execute("UPDATE bench_counter SET value = value + 1 WHERE id = 1")
                ended = time.monotonic()
            added.append(starts.pop() - ended)
    finally:
        DjangoLock._release_waited = waited  # type: ignore[method-assign]
        DjangoLock._release = plain  # type: ignore[method-assign]
    return [max(0.0, a) for a in added[20:]]  # (the first 20: warm-up)


#: Who held the hot key, in order, and for how long each view ran.
holds: list[tuple[int, float, float]] = []


def hot_view(request: Any) -> Any:
    from django.db import connection
    from django.http import HttpResponse

    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM bench_counter WHERE id = 1")
        (value,) = cursor.fetchone()
        cursor.execute("UPDATE bench_counter SET value = %s WHERE id = 1", [value + 1])
    holds.append((threading.get_ident(), began, time.monotonic()))
    return HttpResponse("ok")


def _views() -> list[Any]:
    from django.urls import path
    from django.views.decorators.csrf import csrf_exempt

    from django_redlock import lock_view

    return [
        path("after/", csrf_exempt(lock_view(RESOURCE, wait=30)(hot_view))),
        path(
            "before/",
            csrf_exempt(lock_view(RESOURCE, wait=30, release_before_commit=True)(hot_view)),
        ),
    ]


#: Filled by the measuring process once Django is set up (ROOT_URLCONF is this module).
urlpatterns: list[Any] = []


def _hot_key(posts: int, early: bool) -> str:
    from django.db import connection, connections
    from django.test import Client

    connections.settings["default"]["ATOMIC_REQUESTS"] = True
    with connection.cursor() as cursor:
        cursor.execute("UPDATE bench_counter SET value = 0 WHERE id = 1")
    holds.clear()
    failed: list[int] = []
    start = threading.Barrier(THREADS + 1)

    def post() -> None:
        client = Client(raise_request_exception=False)
        start.wait()
        for _ in range(posts):
            status = client.post("/before/" if early else "/after/").status_code
            if status != 200:
                failed.append(status)
        connection.close()

    threads = [threading.Thread(target=post) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - began
    connections.settings["default"]["ATOMIC_REQUESTS"] = False
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM bench_counter WHERE id = 1")
        (value,) = cursor.fetchone()
    handoffs = sum(a[0] != b[0] for a, b in zip(holds, holds[1:], strict=False))
    busy = sum(end - start_ for _, start_, end in holds)
    lost = len(holds) - value
    return (
        f"{len(holds) / wall:6.0f} holds/s  {handoffs / wall:6.0f} hand-offs/s  "
        f"busy {busy / wall:5.1%}  lost updates {lost:3}  failed {len(failed)}"
    )


if __name__ == "__main__":
    main()
