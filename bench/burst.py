"""Scenario (f): many callers at once in one process, each on a key of its own, 5 local masters
(single-node locks: the first one).

- Burst: 1,000 asyncio tasks started together (``asyncio.gather``), each one attempt
  (``wait=0``) at a key of its own, holding it 20 ms, then releasing. Each implementation runs in a
  fresh process (``crowd.py burst``): the ``cold`` burst is its first use there (connects, script
  loading; imports and client objects made before), the ``warm`` one the second burst in the same
  process.
- Threads: 200 threads released together, each making 10 such acquisitions with the sync API, in a
  fresh process.

Measured: acquisitions that succeeded; their latency (asking to holding; p50, p99);
throughput = successes / wall time of the burst (first task started to last one done, holds
included); lock-path connections from the process on each master (``census.Census``, from this
process: sampled every 50 ms during the burst and once after it, the most on any master), pub/sub
ones apart; the process's open file descriptors before the first burst and at their peak.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import redis

from django_redlock.testing.masters import local_masters

from . import report
from .census import Census
from .remote import CROWD, Unavailable, Worker

TASKS = 1000
THREADS = 200
CYCLES = 10
HOLD = 0.02
TTL = 10.0
INTERVAL = 0.05
#: A process silent this long is stuck: its row says so.
DEADLINE = 600.0

#: Issue 22: ours alone at growing bursts (each cold and warm, in a fresh process), and many
#: threads: every one must succeed on healthy masters, the latency grow about linearly, and no
#: key be left on the masters once the burst's releases have returned.
SCALE_TASKS = (1_000, 10_000, 20_000, 50_000)
SCALE_THREADS = 1_000

#: (row label, implementation, extra config, masters, what the row is)
BURST = [
    (
        "ours (async)",
        "ours",
        {},
        5,
        "async with Redlock(5 urls, node_timeout=0.05).lock(key, ttl=10, wait=0)",
    ),
    (
        "pottery (AIORedlock)",
        "pottery",
        {},
        5,
        "AIORedlock(key, 5 redis.asyncio clients, default pools).acquire(blocking=False)",
    ),
    (
        "redlock-ng (async)",
        "redlock-ng-async",
        {},
        5,
        "AsyncRedlock(retry_count=0).acquire(key, 10000) (own venv: redis-py 5)",
    ),
    (
        "single: redis-py Lock (asyncio)",
        "redis-py-lock",
        {},
        1,
        "redis.asyncio Redis (default pool: at most 100 connections).lock(key, timeout=10)"
        ".acquire(blocking=False)",
    ),
    (
        "single: redis-py Lock (asyncio, max_connections=1000)",
        "redis-py-lock",
        {"max_connections": 1000},
        1,
        "the same with a pool of at most 1000 connections",
    ),
]
THREADED = [
    ("ours (sync)", "ours", 5, "with Redlock(5 urls, node_timeout=0.05).lock(key, ttl=10, wait=0)"),
    ("pottery", "pottery", 5, "pottery.Redlock(key, 5 redis clients).acquire(blocking=False)"),
    ("redlock-ng", "redlock-ng", 5, "Redlock(retry_count=0).acquire(key, 10000) (own venv)"),
    (
        "single: redis-py Lock",
        "redis-py-lock",
        1,
        "Redis (default pool: at most 100 connections).lock(key, timeout=10)"
        ".acquire(blocking=False)",
    ),
]


def figures(result: dict[str, Any]) -> dict[str, Any]:
    """A crowd process's report as the numbers of one row."""
    acquired = result["acquired_ns"]
    return {
        "acquired": len(acquired),
        "p50_ms": report.percentile_ms(acquired, 0.50),
        "p99_ms": report.percentile_ms(acquired, 0.99),
        "failed_p50_ms": report.percentile_ms(result["failed_ns"], 0.50),
        "per_second": len(acquired) / (result["wall_ns"] / 1e9),
        "errors": result["errors"],
        "release_errors": result["release_errors"],
        "release_kinds": result.get("release_kinds", {}),
        "keys_left": result.get("keys_left", 0),
        **{k: result[k] for k in ("conns_peak", "conns_after", "pubsub_peak")},
        **{k: result[k] for k in ("fds_before", "fds_peak", "fds_after")},
    }


def keys_left(urls: Sequence[str], pattern: str) -> int:
    """Keys matching ``pattern`` on the masters at ``urls``, right now."""
    left = 0
    for url in urls:
        with redis.Redis.from_url(url) as client:
            left += sum(1 for _ in client.scan_iter(match=pattern, count=10_000))
    return left


def crowd(mode: str, implementation: str, config: dict[str, Any], parts: int) -> list[Any]:
    """Run one ``crowd.py`` process through its ``parts`` measured parts, counting its
    connections from here while each runs and right after it, and the keys its callers left
    on the masters right after it (every caller's release has returned by then)."""
    process = Worker(implementation, config, mode=mode, script=CROWD)
    census: Census | None = None
    try:
        results = []
        for _ in range(parts):
            process.read(timeout=DEADLINE)  # ready
            census = census or Census(process.proc.pid, config["urls"], INTERVAL)
            with census.sampling():
                process.send("go")
                result = process.read(timeout=DEADLINE)
            result["keys_left"] = keys_left(config["urls"], f"*{config['key']}:*")
            results.append(figures({**result, **census.figures()}))
        return results
    finally:
        process.close()
        if census is not None:
            census.close()


def run(
    *,
    tasks: int = TASKS,
    threads: int = THREADS,
    cycles: int = CYCLES,
    scale_tasks: Sequence[int] = SCALE_TASKS,
    scale_threads: int = SCALE_THREADS,
    peers: bool = True,
) -> tuple[str, dict[str, Any]]:
    """Markdown and data for scenario (f): side by side with the peers (unless not ``peers``),
    then ours alone at ``scale_tasks`` tasks and ``scale_threads`` threads."""
    started = time.monotonic()
    data: dict[str, Any] = {"scenario": "f", "environment": report.environment()}
    data["burst"] = {"cold": {}, "warm": {}}
    data["threads"] = {}
    base = {"ttl": TTL, "hold": HOLD}
    with local_masters(5) as masters:
        urls = [m.url for m in masters]
        data["scale"] = _scale(urls, scale_tasks, scale_threads, cycles)
        for n, (label, implementation, extra, used, _) in enumerate(BURST if peers else []):
            config = {**base, **extra, "urls": urls[:used], "tasks": tasks}
            config["key"] = f"bench:burst:{n}"
            try:
                cold, warm = crowd("burst", implementation, config, 2)
            except (Unavailable, RuntimeError) as exc:
                cold = warm = {"error": str(exc)[:200]}
            data["burst"]["cold"][label], data["burst"]["warm"][label] = cold, warm
        for n, (label, implementation, used, _) in enumerate(THREADED if peers else []):
            config = {**base, "urls": urls[:used], "threads": threads, "cycles": cycles}
            config["key"] = f"bench:threads:{n}"
            try:
                (one,) = crowd("threads", implementation, config, 1)
            except (Unavailable, RuntimeError) as exc:
                one = {"error": str(exc)[:200]}
            data["threads"][label] = one
    took = time.monotonic() - started

    burst_rows = [
        _row(label, used, data["burst"][phase], tasks, phase, meaning)
        for label, _, _, used, meaning in (BURST if peers else [])
        for phase in ("cold", "warm")
    ]
    thread_rows = [
        _row(label, used, data["threads"], threads * cycles, "", meaning)
        for label, _, used, meaning in (THREADED if peers else [])
    ]
    headers = ["implementation", "masters", "process", "acquired", "p50 ms", "p99 ms"]
    headers += ["acquisitions/s", "lock connections per master: peak / after", "pub/sub"]
    headers += ["fds: before / peak", "failures", "what it is"]
    text = "\n".join(
        [
            f"## (f) Many callers in one process: {tasks:,} asyncio tasks at once, "
            f"{threads} threads x {cycles}",
            "",
            f"{data['environment']}. Every caller: one attempt (wait=0) at a key of its own, held "
            f"{HOLD * 1000:g} ms, then released. Each implementation in a fresh process; 'cold' "
            "is its first use there (connects and script loading included, imports not), "
            "'warm' the second burst in the same process. Latency: asking to holding, successes "
            "only. acquisitions/s: successes / wall time of the burst (holds included). "
            "Connections: from that process (counted from outside it with CLIENT LIST and its "
            f"sockets), sampled every {INTERVAL * 1000:g} ms and right after the burst, the most "
            "on any master it uses; pub/sub connections counted apart. fds: the process's open "
            "file descriptors before the first burst and at their peak. Ratios are to the best "
            "peer (ours excluded) in the same process state. "
            "Targets for ours (issue 10): all succeed; at most 2 lock-path connections per "
            f"master; p99 <= 100 ms. Took {took:.1f} s.",
            "",
            f"### Burst: {tasks:,} asyncio tasks at once",
            "",
            report.table(headers, burst_rows),
            "",
            f"### Threads: {threads} threads x {cycles} acquisitions (sync API, cold process)",
            "",
            report.table([h for h in headers if h != "process"], thread_rows),
            "",
            _scale_text(data["scale"], cycles),
        ]
    )
    return text, data


def _scale(
    urls: list[str], tasks: Sequence[int], threads: int, cycles: int
) -> dict[str, dict[str, Any]]:
    """Ours alone: a fresh process per burst size (cold, then warm), then the threads."""
    base = {"ttl": TTL, "hold": HOLD, "urls": urls}
    rows: dict[str, dict[str, Any]] = {}
    for n in tasks:
        config = {**base, "tasks": n, "key": f"bench:scale:{n}"}
        try:
            cold, warm = crowd("burst", "ours", config, 2)
        except (Unavailable, RuntimeError) as exc:
            cold = warm = {"error": str(exc)[:200]}
        rows[f"{n:,} tasks cold"], rows[f"{n:,} tasks warm"] = cold, warm
    config = {**base, "threads": threads, "cycles": cycles, "key": "bench:scale:threads"}
    try:
        (rows[f"{threads:,} threads x {cycles}"],) = crowd("threads", "ours", config, 1)
    except (Unavailable, RuntimeError) as exc:
        rows[f"{threads:,} threads x {cycles}"] = {"error": str(exc)[:200]}
    return rows


def _scale_text(rows: dict[str, dict[str, Any]], cycles: int) -> str:
    headers = ["ours (5 masters)", "acquired", "acquisition errors", "release errors"]
    headers += ["p50 ms", "p99 ms", "acquisitions/s", "keys left after"]
    headers += ["lock connections per master: peak / after"]
    table = []
    for label, d in rows.items():
        if "error" in d:
            table.append([label, *["n/a"] * 7, f"not measured: {d['error']}"])
            continue
        total = d["acquired"] + sum(count for count, _ in d["errors"].values())
        errors = ", ".join(f"{c} x {k}" for k, (c, _) in d["errors"].items()) or "none"
        releases = ", ".join(f"{c} x {k}" for k, (c, _) in d["release_kinds"].items())
        table.append(
            [
                label,
                f"{d['acquired']:,}/{total:,}",
                errors,
                releases or "none",
                report.number(d["p50_ms"]),
                report.number(d["p99_ms"]),
                report.number(d["per_second"]),
                str(d["keys_left"]),
                f"{d['conns_peak']} / {d['conns_after']}",
            ]
        )
    return "\n".join(
        [
            "### Ours at scale (issue 22): growing bursts and many threads",
            "",
            "Each burst size in a fresh process, cold then warm; every caller one attempt "
            f"(wait=0) at a key of its own, held {HOLD * 1000:g} ms. Threads: each makes "
            f"{cycles} such acquisitions with the sync API. Keys left: lock keys of the burst "
            "on all five masters right after every caller's release returned. Targets: no "
            "error of any kind on healthy masters, latency about linear in N, no key left.",
            "",
            report.table(headers, table),
        ]
    )


def _row(
    label: str, used: int, rows: dict[str, Any], total: int, phase: str, meaning: str
) -> list[str]:
    d = rows[label]
    cells = [label, str(used), *([phase] if phase else [])]
    if "error" in d:
        return [*cells, *["n/a"] * 7, f"not measured: {d['error']}", meaning]
    best = {k: report.best_peer(rows, k) for k in ("p50_ms", "p99_ms")}
    fastest = report.best_peer(rows, "per_second", highest=True)
    return [
        *cells,
        f"{d['acquired']}/{total}",
        report.with_ratio(d["p50_ms"], best["p50_ms"], 1),
        report.with_ratio(d["p99_ms"], best["p99_ms"], 1),
        report.with_ratio(d["per_second"], fastest),
        f"{d['conns_peak']} / {d['conns_after']}",
        str(d["pubsub_peak"]),
        f"{d['fds_before']} / {d['fds_peak']}",
        report.failures(d),
        meaning,
    ]
