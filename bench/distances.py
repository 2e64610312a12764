"""Scenario (b) with masters at different distances (issue 23 item 15): five masters behind
loopback proxies giving round trips of 1, 1, 1, 20 and 40 ms (``--distances``), each group of
equal distance served by a proxy process of its own.

A round is decided when a quorum (3 of 5) has granted: it returns then, and the slower masters'
replies complete in the background. An acquire+release cycle is two rounds, so the target is a
cycle within 1.1x of two third-fastest round trips (measured with PING through each proxy),
where waiting for every master would cost two of the slowest (40 ms) ones.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from django_redlock.engine.base.protocol import quorum
from django_redlock.testing.masters import local_masters

from . import report
from .cycle import (
    MASTERS,
    Contender,
    Floor,
    Ours,
    OursAsync,
    OursWith,
    closing_all,
    describe_leftovers,
    leftovers,
    load_scripts,
    measure,
    ping_rtt_ms,
)
from .proxies import delayed

DISTANCES_MS = (1.0, 1.0, 1.0, 20.0, 40.0)
#: The target: a cycle within this many times two third-fastest round trips.
TARGET = 1.1


def run(
    *,
    distances_ms: Sequence[float] = DISTANCES_MS,
    rounds: int = 10,
    cycles: int = 20,
    warmup: int = 10,
) -> tuple[str, dict[str, Any]]:
    """Markdown and data for scenario (b) at mixed distances."""
    if len(distances_ms) != MASTERS:
        raise ValueError(f"give {MASTERS} distances, got {list(distances_ms)}")
    started = time.monotonic()
    with local_masters(MASTERS) as masters, contextlib.ExitStack() as stack:
        load_scripts(masters)
        ports = [0] * MASTERS
        for distance in sorted(set(distances_ms)):
            group = [i for i, d in enumerate(distances_ms) if d == distance]
            # Half the round trip each way.
            proxied = stack.enter_context(
                delayed([masters[i].port for i in group], distance / 2000)
            )
            for i, port in zip(group, proxied, strict=True):
                ports[i] = port
        urls = [f"redis://127.0.0.1:{port}/0" for port in ports]
        rtts = [ping_rtt_ms(("127.0.0.1", port)) for port in ports]
        decisive = sorted(rtts)[quorum(MASTERS) - 1]
        nearest = sorted(range(MASTERS), key=lambda i: rtts[i])[: quorum(MASTERS)]
        contenders: list[Contender] = [
            # The least a quorum's two rounds can take, with all three requests in flight at
            # once through the proxies (a lone PING is a little quicker than the last of three).
            Floor([("127.0.0.1", ports[i]) for i in nearest], "bench:far:floor"),
            Ours(urls, "bench:far:sync"),
            OursWith(urls, "bench:far:with"),
            OursAsync(urls, "bench:far:async"),
        ]
        with closing_all(contenders):
            results = measure(contenders, rounds=rounds, cycles=cycles, warmup=warmup)
        left = describe_leftovers(leftovers(masters), "after the run")
    took = time.monotonic() - started
    target = 2 * decisive
    data: dict[str, Any] = {
        "scenario": "b-distances",
        "environment": report.environment(),
        "distances_ms": list(distances_ms),
        "rtts_ms": rtts,
        "two_decisive_rtts_ms": target,
        "rows": {},
    }
    rows = []
    floor = report.summarize(results[Floor.name].times_ns, results[Floor.name].errors)
    for contender in contenders:
        s = report.summarize(results[contender.name].times_ns, results[contender.name].errors)
        median, p99 = s.median_us / 1000, s.p99_us / 1000
        data["rows"][contender.name] = {"median": median, "p99": p99, "errors": s.errors}
        name = "floor: the 3 nearest masters only" if contender.name == Floor.name else None
        rows.append(
            [
                name or contender.name,
                f"{median:.2f}",
                f"{p99:.2f}",
                f"{median / target:.2f}x",
                f"{s.median_us / floor.median_us:.2f}x",
                f"{s.cycles}" + (f" ({s.errors} failed: {s.first_error})" if s.errors else ""),
            ]
        )
    headers = ["implementation", "median ms", "p99 ms", "median / 2 x third RTT"]
    headers += ["median / floor's", "cycles"]
    rtt_text = ", ".join(f"{r:.2f}" for r in rtts)
    text = "\n".join(
        [
            "## (b) Uncontended acquire+release, masters at round trips of "
            + ", ".join(f"{d:g}" for d in distances_ms)
            + " ms",
            "",
            f"{data['environment']}. Round trips through the proxies (PING, median of 50): "
            f"{rtt_text} ms; the third fastest decides a round: two of them, {target:.2f} ms, "
            f"are the least a cycle can take; the floor (the raw protocol, to the three nearest "
            f"masters only, every reply read) is that with three requests in flight at once. "
            f"Target: median within {TARGET}x of two third-fastest round trips. "
            f"{rounds} rounds x {cycles} cycles per implementation, order rotated each round, "
            f"{warmup} warm-up cycles each; took {took:.1f} s.",
            "",
            report.table(headers, rows),
            "",
            left,
        ]
    )
    return text, data
