"""Scenario (h): many auto-extended leases in one process, renewed by its watchdog, with one
master of three 40 ms away (a ``DelayProxy`` adding 20 ms each way, in a process of its own:
``bench/proxies.py``; inside the default 50 ms node budget).

Per TTL: 10,000 locks (``auto_extend=True``, each on a key of its own) are acquired in one event
loop, ``BATCH`` at a time (``asyncio.gather``: 10,000 at once would take seconds of client CPU,
and a lease's validity runs from when its attempt began, so the last ones would start with little
of their TTL left), then held for ``hold`` seconds while the loop sleeps: only the watchdog
works. Measured:

- kept: leases still held (``lock.held``, asked by their owner) at the end; lost: ``on_lost``
  calls (each one a lease the watchdog could not renew in time);
- renewals made (every lease's extension count), and per lease and second;
- the watchdog thread's CPU over the hold (its own thread clock), as % of one core, and per
  renewal; the whole process's CPU over the hold, for comparison.

No peer row: the peers' auto-renewal (pottery has none; python-redis-lock renews one lock per
thread) is not the same thing. The issue this answers measured the previous watchdog (one thread
renewing one lease after another): with 200 leases of ttl=2 s, 171 were lost within 6 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

from django_redlock.engine import Lock, Redlock
from django_redlock.engine.base.errors import LockLost
from django_redlock.testing.masters import local_masters

from . import report
from .proxies import delayed

LEASES = 10_000
#: Acquired this many at a time.
BATCH = 500
HOLD = 25.0
#: Each way: a master 40 ms away, round trip.
DELAY = 0.02
#: The TTLs measured: the default (renewed every 10 s) and a third of it (every 3.3 s).
TTLS = (30.0, 10.0)


def watchdog_cpu() -> float:
    """CPU seconds the watchdog thread has used (0.0 before it started)."""
    for thread in threading.enumerate():
        if thread.name == "redlock-watchdog" and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


def measure(urls: list[str], leases: int, ttl: float, hold: float) -> dict[str, Any]:
    engine = Redlock(urls)
    lost: list[str] = []

    def on_lost(lock: Lock, error: LockLost) -> None:
        lost.append(lock.resource)

    locks = [
        engine.lock(f"renewed:{ttl}:{i}", ttl=ttl, auto_extend=True, on_lost=on_lost)
        for i in range(leases)
    ]

    async def main() -> dict[str, Any]:
        began = time.monotonic()
        outcomes: list[object] = []
        for first in range(0, leases, BATCH):
            batch = locks[first : first + BATCH]
            outcomes += await asyncio.gather(
                *(lock.aacquire() for lock in batch), return_exceptions=True
            )
        acquired = sum(not isinstance(o, BaseException) for o in outcomes)
        acquire_s = time.monotonic() - began
        leases_of = [engine.holders.get(lock.key) for lock in locks]
        cpu, process_cpu, start = watchdog_cpu(), time.process_time(), time.monotonic()
        await asyncio.sleep(hold)
        cpu = watchdog_cpu() - cpu
        process_cpu = time.process_time() - process_cpu
        wall = time.monotonic() - start
        kept = sum(lock.held for lock in locks)
        renewals = sum(lease.extensions for lease in leases_of if lease is not None)
        await asyncio.gather(*(lock.arelease() for lock in locks), return_exceptions=True)
        return {
            "leases": leases,
            "ttl": ttl,
            "acquired": acquired,
            "acquire_s": acquire_s,
            "kept": kept,
            "lost": len(lost),
            "renewals": renewals,
            "renewals_per_s": renewals / wall,
            "watchdog_cpu_pct": 100 * cpu / wall,
            "watchdog_us_per_renewal": 1e6 * cpu / renewals if renewals else float("nan"),
            "process_cpu_pct": 100 * process_cpu / wall,
        }

    try:
        return asyncio.run(main())
    finally:
        engine.close()


def run(leases: int = LEASES, hold: float = HOLD) -> tuple[str, dict[str, Any]]:
    rows, data = [], {}
    with local_masters(3) as masters, delayed([masters[0].port], DELAY) as [far]:
        urls = [f"redis://127.0.0.1:{far}/0", masters[1].url, masters[2].url]
        for ttl in TTLS:
            figures = measure(urls, leases, ttl, hold)
            data[f"ttl={ttl}"] = figures
            rows.append(
                [
                    f"{leases:,} leases, ttl={ttl:g} s (renewed every {ttl / 3:.2g} s)",
                    f"{figures['acquired']:,} in {figures['acquire_s']:.1f} s ({BATCH} at a time)",
                    f"{figures['kept']:,}",
                    f"{figures['lost']:,}",
                    f"{figures['renewals']:,} ({figures['renewals_per_s']:,.0f}/s)",
                    f"{figures['watchdog_cpu_pct']:.0f} % "
                    f"({figures['watchdog_us_per_renewal']:.0f} us/renewal)",
                    f"{figures['process_cpu_pct']:.0f} %",
                ]
            )
    text = "\n\n".join(
        [
            f"### (h) {leases:,} auto-extended leases in one process, one of 3 masters 40 ms "
            f"away, held {hold:g} s",
            report.table(
                [
                    "leases",
                    "acquired",
                    "kept",
                    "lost",
                    "renewals",
                    "watchdog CPU (one core)",
                    "process CPU over the hold",
                ],
                rows,
            ),
            report.environment(
                "3 masters on 127.0.0.1, the first behind a proxy adding 20 ms each way"
            ),
        ]
    )
    return text, data


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        print(run()[0])
