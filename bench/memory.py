"""Scenario (e): what one held lock costs in memory, in the client and on the masters.

Each implementation runs in a fresh worker process (``worker.py serve``), so that nothing another
implementation allocated is counted. The worker opens its connections first (a few cycles), then
acquires ``n`` locks on distinct resources and keeps them:

- client: what ``tracemalloc`` saw allocated while acquiring them (still alive after
  ``gc.collect()``), divided by ``n``: the lock objects, tokens, stored values, bookkeeping;
- masters: ``INFO memory`` ``used_memory`` less client buffers (``mem_clients_normal``), summed
  over the 5 masters, after minus before, divided by ``n`` (every copy on every master); keys
  added per lock (``DBSIZE``); and
  ``MEMORY USAGE`` / ``STRLEN`` of one lock key on the first master.

Ours twice: the engine (``Redlock(urls).lock(key)``) and the way a Django project takes it
(``redlock(key)`` over ``settings.REDLOCK``, the app installed), which issue 20 measures.

The floor keeps a (key, token) tuple per lock and stores ``SET key <32 hex chars> PX`` on every
master: the least a Redlock client can keep and store.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import redis

from django_redlock.testing.masters import LocalMaster, local_masters

from . import report
from .remote import Unavailable, Worker

LOCKS = 1000

#: (row label, worker implementation, masters used, what is kept per lock)
IMPLEMENTATIONS = [
    ("floor", "floor", 5, "a (key, token) tuple; SET key <32 hex> NX PX on each master"),
    ("ours", "ours", 5, "a Lock (+ its Lease) per resource; value = token + owner JSON"),
    (
        "ours: redlock()",
        "ours-django",
        5,
        "as ours, through redlock() with Django settings (observer, signals, metrics, DB guard "
        "on): a DjangoLock, and the watchdog's look at its expiry (the lost signal)",
    ),
    ("pottery", "pottery", 5, "a pottery.Redlock per resource"),
    ("redlock-py", "redlock-py", 5, "the Lock namedtuple lock() returns"),
    ("redlock-ng", "redlock-ng", 5, "the Lock object acquire() returns (own venv)"),
    ("single: redis-py Lock", "redis-py-lock", 1, "a redis.lock.Lock per resource"),
    ("single: python-redis-lock", "python-redis-lock", 1, "a redis_lock.Lock per resource"),
]


def used_memory(masters: Sequence[LocalMaster]) -> tuple[int, int]:
    """(used_memory less client buffers, summed over the masters; keys summed likewise). Client
    buffers grow and shrink with traffic, not with the locks held: left in, they made this figure
    jump by hundreds of bytes per lock from run to run."""
    memory = keys = 0
    for master in masters:
        client = master.client()
        try:
            info = client.info("memory")
            memory += int(info["used_memory"]) - int(info.get("mem_clients_normal", 0))
            keys += int(client.dbsize())
        finally:
            client.close()
    return memory, keys


def one_key(master: LocalMaster, pattern: str) -> tuple[float, float]:
    """(MEMORY USAGE, STRLEN) of the first key matching ``pattern`` on ``master``."""
    client = master.client()
    try:
        for key in client.scan_iter(match=pattern, count=1000):
            return float(client.memory_usage(key, samples=0) or math.nan), float(client.strlen(key))
    finally:
        client.close()
    return math.nan, math.nan


def measure(
    implementation: str, masters: Sequence[LocalMaster], used: int, n: int, tag: str
) -> dict[str, Any]:
    """``tag``: two characters naming the row in its keys (``bench:mem:<tag>:<i>``): every row's
    names are as long, so that no row keeps (or stores) more bytes for a longer name."""
    urls = [m.url for m in masters][:used]
    prefix = f"bench:mem:{tag}:"
    worker = Worker(implementation, {"urls": urls, "key": f"{prefix}warm", "ttl": 60.0})
    try:
        if implementation != "floor":
            worker.ask(op="cycles", n=3)  # connections open, scripts loaded
        time.sleep(0.05)
        memory_before, keys_before = used_memory(masters)
        held = worker.ask(op="hold", n=n, prefix=prefix)
        memory_after, keys_after = used_memory(masters)
        usage, strlen = one_key(masters[0], f"*{prefix}7")
        worker.ask(op="drop")
    finally:
        worker.close()
    count = held["held"] or math.nan
    return {
        "client_bytes": held["client_bytes"] / count,
        "redis_bytes": (memory_after - memory_before) / count,
        "keys": (keys_after - keys_before) / count,
        "memory_usage": usage,
        "strlen": strlen,
        "held": held["held"],
        "errors": held["errors"],
    }


def run(*, n: int = LOCKS) -> tuple[str, dict[str, Any]]:
    """Markdown and data for scenario (e)."""
    started = time.monotonic()
    data: dict[str, Any] = {"scenario": "e", "environment": report.environment(), "rows": {}}
    with local_masters(5) as masters:
        # Unmeasured: the masters' key tables grow (and stay grown) the first time they hold n
        # keys; without this pass the first row measured pays for that growth alone.
        measure("floor", masters, 5, n, "xx")
        for index, (label, implementation, used, _) in enumerate(IMPLEMENTATIONS):
            try:
                data["rows"][label] = measure(implementation, masters, used, n, f"{index:02d}")
            except (Unavailable, RuntimeError, redis.RedisError) as exc:
                data["rows"][label] = {"error": str(exc)[:200]}
    floor = data["rows"]["floor"]
    rows = []
    for label, _, used, kept in IMPLEMENTATIONS:
        d = data["rows"][label]
        if "error" in d:
            rows.append([label, str(used), "n/a", "n/a", "n/a", "n/a", f"{kept} ({d['error']})"])
            continue
        note = f" ({d['errors'][0]})" if d["errors"] else ""
        rows.append(
            [
                label,
                str(used),
                report.with_ratio(d["client_bytes"], floor["client_bytes"]),
                report.with_ratio(d["redis_bytes"], floor["redis_bytes"]),
                report.number(d["keys"], 1),
                report.with_ratio(d["memory_usage"], floor["memory_usage"])
                + f" / {report.number(d['strlen'])}",
                kept + note,
            ]
        )
    headers = ["implementation", "masters", "client bytes per lock (x floor)"]
    headers += ["Redis bytes per lock, all masters (x floor)", "keys per lock"]
    headers += ["MEMORY USAGE (x floor) / value bytes of one key", "kept per lock"]
    text = "\n".join(
        [
            f"## (e) Memory per held lock ({n} locks held at once)",
            "",
            f"{data['environment']}. Client: tracemalloc in a fresh worker process per "
            "implementation, after its connections were open. Redis: INFO used_memory less "
            "client buffers, summed over the masters, after minus before (includes every copy; "
            "one unmeasured pass first grows the masters' hash tables, so that the first row does "
            "not pay for everyone), MEMORY USAGE and STRLEN of one lock key. Took "
            f"{time.monotonic() - started:.1f} s.",
            "",
            report.table(headers, rows),
        ]
    )
    return text, data
