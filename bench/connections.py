"""``python -m bench.connections [--processes 50]``: how many connections each master gets from
many client processes, counted on the masters (``connected_clients``, and ``CLIENT LIST`` for the
pub/sub ones), with real processes (``bench/worker.py idle``) on 5 local masters:

- ``cycle``: each process made one acquire+release (sync) and keeps its engine;
- ``sync+async``: one cycle from a thread and one in a long-lived event loop (an ASGI worker);
- ``auto_extend``: each process holds a lease renewed by the watchdog (ttl 10 s);
- ``wait``: each process waits for a key the benchmark holds (a queued waiter, listening to its
  process's inbox for the wake-up notice).

Per process = (connections with the processes up - without them) / processes, per master; the
line for 1,000 processes multiplies it. Never run by the test suite; it asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import time
from collections.abc import Iterator, Sequence

from django_redlock.engine import Redlock
from django_redlock.testing.masters import LocalMaster, local_masters

from . import report
from .handoff import uptime
from .remote import spawn

WHAT = ("cycle", "sync+async", "auto_extend", "wait")
MASTERS = 5


def census(masters: Sequence[LocalMaster]) -> list[tuple[int, int]]:
    """Per master: (connected clients, of which pub/sub), our counting connection left out."""
    counts = []
    for master in masters:
        client = master.client()
        try:
            listed = client.client_list()
            pubsub = sum(
                1 for c in listed if any(int(c.get(k, 0) or 0) > 0 for k in ("sub", "psub", "ssub"))
            )
            counts.append((len(listed) - 1, pubsub))
        finally:
            client.close()
    return counts


def client_memory(masters: Sequence[LocalMaster]) -> list[int]:
    """Per master: bytes its clients' buffers and structures take (``mem_clients_normal``;
    pub/sub subscribers are normal clients)."""
    found = []
    for master in masters:
        client = master.client()
        try:
            found.append(int(client.info("memory")["mem_clients_normal"]))
        finally:
            client.close()
    return found


@contextlib.contextmanager
def processes(what: str, urls: list[str], n: int) -> Iterator[None]:
    # A generous node budget: 50 processes starting at once on a loaded 2-CPU machine miss the
    # default 50 ms, and what is counted here is connections, not speed.
    config = {"urls": urls, "ttl": 10.0, "timeout": 1.0, "what": what, "key": "bench:connections"}
    workers: list[subprocess.Popen[str]] = []
    try:
        for _ in range(n):
            workers.append(spawn("idle", "ours", config))
        for proc in workers:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line or not json.loads(line).get("ready"):
                raise RuntimeError(f"a worker did not start (exit {proc.poll()})")
        yield
    finally:
        for proc in workers:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
        for proc in workers:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def settle(masters: Sequence[LocalMaster], expected: list[int], deadline: float = 10.0) -> None:
    """Wait until the masters see the processes' connections closed."""
    stop = time.monotonic() + deadline
    while time.monotonic() < stop:
        if [c for c, _ in census(masters)] == expected:
            return
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.connections", description=__doc__)
    parser.add_argument("--processes", type=int, default=50, help="client processes (50)")
    parser.add_argument("what", nargs="*", help=f"rows: {' '.join(WHAT)} (default: all)")
    args = parser.parse_args(argv)
    unknown = [w for w in args.what if w not in WHAT]
    if unknown:
        parser.error(f"unknown row {', '.join(unknown)}; choose from {' '.join(WHAT)}")
    if args.processes < 1:
        parser.error(f"--processes must be >= 1, got {args.processes}")
    lines = [f"`{uptime()}`", ""]
    with local_masters(MASTERS) as masters:
        urls = [m.url for m in masters]
        holder = Redlock(urls)
        lines.append(f"{report.environment()}. {args.processes} processes per row.")
        lines.append("")
        headers = ["each process", "connections per master, all processes (min-max)"]
        headers += ["of which pub/sub", "per process per master", "1,000 processes"]
        headers += ["master memory per connection, KiB"]
        rows = []
        for what in args.what or WHAT:
            # Long enough for 50 processes to start on a loaded machine.
            held = holder.lock("bench:connections", ttl=600).acquire() if what == "wait" else None
            baseline = census(masters)
            memory_before = client_memory(masters)
            with processes(what, urls, args.processes):
                # A waiter's subscription is made before it is ready; a watchdog connects its
                # own loop's pipes at its first renewal, a third of the TTL (10 s) in.
                time.sleep(4.5 if what == "auto_extend" else 0.3)
                up = census(masters)
                memory_up = client_memory(masters)
            if held is not None:
                held.release()
            settle(masters, [c for c, _ in baseline])
            added = [u[0] - b[0] for u, b in zip(up, baseline, strict=True)]
            pubsub = [u[1] - b[1] for u, b in zip(up, baseline, strict=True)]
            per = max(added) / args.processes
            memory = [u - b for u, b in zip(memory_up, memory_before, strict=True)]
            per_connection = max(memory) / max(max(added), 1)
            rows.append(
                [
                    what,
                    f"{min(added)}-{max(added)}",
                    f"{min(pubsub)}-{max(pubsub)}",
                    f"{per:.2f}",
                    f"{per * 1000:,.0f}",
                    f"{per_connection / 1024:,.1f}",
                ]
            )
        holder.close()
    lines.append(report.table(headers, rows))
    lines.append("")
    lines.append(f"`{uptime()}`")
    text = "\n".join(lines)
    print(text)
    print(f"(saved to {report.save('connections', text)})")


if __name__ == "__main__":
    main()
