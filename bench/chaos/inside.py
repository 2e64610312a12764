"""Small programs that the separate-hosts harness (``hosts.py``) runs inside a namespace, driven
over stdin/stdout, one line per command and per answer.

    python -m bench.chaos.inside proxy <listen address> <listen port> <target port>
        A DelayProxy on the host's address, forwarding to the master on the host's loopback.
        Says "ready"; then "delay <seconds>" -> "ok".

    python -m bench.chaos.inside probe
        A client on a client host that times lock operations, through the public API only.
        Says "ready"; then one JSON command per line -> one JSON answer per line:
        {"op": "engine", "nodes": [...], "node_timeout": s, "mode": "sync"|"async"}: a new engine
            (no connection yet; the previous one is closed)
        {"op": "warm"}: acquire and release another resource (opens a connection to every master)
        {"op": "acquire", "resource": r, "ttl": s, "wait": s} / {"op": "extend"} /
        {"op": "release"}: timed -> {"seconds": s, "error": "LockLost: ..." or null,
            "validity": s}
        {"op": "cycles", "resource": r, "seconds": s}: acquire+release cycles for ``s``
            seconds -> {"seconds": [each cycle's], "errors": n}
        {"op": "close"}: close the engine
        {"op": "ping", "url": u, "timeout": s, "size": n}: a fresh connection's PING (or ECHO
            of n bytes) -> {"seconds": s, "error": "TimeoutError: ..." or null}: to show that
            a fault is silent, or slow
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from django_redlock.engine import Lock, Redlock, RedlockError
from django_redlock.testing.proxy import DelayProxy


def proxy(address: str, port: str, target: str) -> None:
    with DelayProxy(int(target), listen_host=address, listen_port=int(port)) as delayed:
        print("ready", flush=True)
        for line in sys.stdin:
            word, value = line.split()
            assert word == "delay"
            delayed.delay = float(value)
            print("ok", flush=True)


class Probe:
    """One engine and one lock at a time; each operation timed from the outside. Every command
    runs in one task (a lock belongs to the task that acquired it)."""

    def __init__(self) -> None:
        self.engine: Redlock | None = None
        self.lock: Lock | None = None
        self.mode = "sync"

    async def call(
        self, sync: Callable[[], object], coroutine: Callable[[], Awaitable[object]]
    ) -> None:
        if self.mode == "sync":
            sync()
        else:
            await coroutine()

    def engine_of(self, command: dict[str, Any]) -> dict[str, Any]:
        self.close()
        self.mode = command["mode"]
        self.engine = Redlock(command["nodes"], node_timeout=command["node_timeout"])
        return {}

    async def warm(self) -> dict[str, Any]:
        assert self.engine is not None
        warm = self.engine.lock("probe-warm", ttl=5)
        await self.call(warm.acquire, warm.aacquire)
        await self.call(warm.release, warm.arelease)
        return {}

    async def timed(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.engine is not None
        op = command["op"]
        if op == "acquire":
            self.lock = self.engine.lock(
                command["resource"], ttl=command["ttl"], wait=command["wait"]
            )
        lock = self.lock
        assert lock is not None
        sync, coroutine = {
            "acquire": (lock.acquire, lock.aacquire),
            "extend": (lock.extend, lock.aextend),
            "release": (lock.release, lock.arelease),
        }[op]
        error = None
        started = time.monotonic()
        try:
            await self.call(sync, coroutine)
        except RedlockError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        seconds = time.monotonic() - started
        return {"seconds": seconds, "error": error, "validity": lock.validity}

    async def cycles(self, command: dict[str, Any]) -> dict[str, Any]:
        """Acquire and release ``resource`` over and over for ``seconds``, each cycle timed."""
        assert self.engine is not None
        took: list[float] = []
        errors = 0
        end = time.monotonic() + command["seconds"]
        while time.monotonic() < end:
            lock = self.engine.lock(command["resource"], ttl=5)
            started = time.monotonic()
            try:
                await self.call(lock.acquire, lock.aacquire)
                await self.call(lock.release, lock.arelease)
            except RedlockError:
                errors += 1
            took.append(time.monotonic() - started)
        return {"seconds": took, "errors": errors}

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine = self.lock = None


def ping(url: str, timeout: float, size: int = 0) -> dict[str, Any]:
    client = redis.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    error = None
    started = time.monotonic()
    try:
        if size:
            client.echo("x" * size)
        else:
            client.ping()
    except redis.RedisError as exc:
        cause = exc.__cause__ or exc.__context__ or exc
        error = f"{type(cause).__name__}: {exc}"[:300]
    finally:
        client.close()
    return {"seconds": time.monotonic() - started, "error": error}


async def probe() -> None:
    state = Probe()
    loop = asyncio.get_running_loop()
    print("ready", flush=True)
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        command = json.loads(line)
        op = command["op"]
        if op == "engine":
            answer = state.engine_of(command)
        elif op == "warm":
            answer = await state.warm()
        elif op == "cycles":
            answer = await state.cycles(command)
        elif op == "close":
            state.close()
            answer = {}
        elif op == "ping":
            answer = ping(command["url"], command["timeout"], command.get("size", 0))
        else:
            answer = await state.timed(command)
        print(json.dumps(answer), flush=True)
    state.close()


if __name__ == "__main__":
    if sys.argv[1] == "proxy":
        proxy(*sys.argv[2:5])
    else:
        asyncio.run(probe())
