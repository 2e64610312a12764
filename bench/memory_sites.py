"""``python -m bench.memory_sites``: where the client bytes of one held lock of ours go (scenario
(e) gives the total next to the floor and the peers): ``tracemalloc`` by allocating line, per held
lock, through the engine (``Redlock(urls).lock(key)``) and through ``redlock()`` with Django
settings, 1000 locks held at once on 5 local masters. Each runs in a process of its own; prints,
saves nothing. The keys are named as scenario (e) names them (``bench:mem:01:<i>``)."""

from __future__ import annotations

import gc
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

from django_redlock.testing.masters import local_masters

LOCKS = 1000
REPO = Path(__file__).resolve().parent.parent


def engine_lock(urls: list[str]) -> Any:
    from django_redlock.engine import Redlock

    engine = Redlock(urls, node_timeout=0.05)
    return lambda key: engine.lock(key, ttl=60.0).acquire()


def django_lock(urls: list[str]) -> Any:
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        INSTALLED_APPS=["django_redlock"],
        REDLOCK={"NODES": urls, "NODE_TIMEOUT": 0.05},
    )
    django.setup()
    from django_redlock import redlock

    return lambda key: redlock(key, ttl=60.0, wait=0).acquire()


def sites(path: str) -> None:
    """In this process: hold ``LOCKS`` locks through ``path`` ("engine" or "redlock()") and
    print what each allocating line kept per held lock."""
    with local_masters(5) as masters:
        acquire = (engine_lock if path == "engine" else django_lock)([m.url for m in masters])
        for i in range(3):
            acquire(f"bench:mem:01:warm-{i}").release()  # connections open, scripts loaded
        held = []
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.take_snapshot()
        start = tracemalloc.get_traced_memory()[0]
        for i in range(LOCKS):
            held.append(acquire(f"bench:mem:01:{i}"))
        gc.collect()
        total = (tracemalloc.get_traced_memory()[0] - start) / LOCKS
        after = tracemalloc.take_snapshot()
        tracemalloc.stop()
        print(f"\n## through {path}: {total:,.0f} bytes per held lock\n")
        print("| bytes | objects | allocated at |\n|---:|---:|---|")
        for stat in after.compare_to(before, "lineno"):
            if stat.size_diff / LOCKS >= 1:
                frame = stat.traceback[0]
                where = Path(frame.filename)
                name = where.relative_to(REPO) if where.is_relative_to(REPO) else where.name
                print(
                    f"| {stat.size_diff / LOCKS:,.1f} | {stat.count_diff / LOCKS:.2f} "
                    f"| {name}:{frame.lineno} |"
                )
        print("\n(bench/memory_sites.py's own line: the resource name and the list slot.)")
        for lock in held:
            lock.release()


def main() -> None:
    if len(sys.argv) > 1:
        sites(sys.argv[1])
        return
    for path in ("engine", "redlock()"):
        subprocess.run([sys.executable, "-m", "bench.memory_sites", path], cwd=REPO, check=True)


if __name__ == "__main__":
    main()
