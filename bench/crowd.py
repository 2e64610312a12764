"""Many callers in one process: the measured process of scenarios (f) and (g).

Run by path, ``python bench/crowd.py <mode> <implementation> <config json>``, by the benchmark's
environment or redlock-ng's (see ``remote.py``), like ``worker.py``, whose sync implementations
and helpers it reuses; so it imports only the standard library (and ``worker``) at the top.

Modes (each prints JSON lines on stdout):

- ``burst``: ``config["tasks"]`` asyncio tasks at once, each on a key of its own, one attempt
  (``wait=0``), holding ``config["hold"]`` seconds. Twice in this one process: ``cold`` (the
  implementation's first use: connects, script loading) and ``warm`` (its second burst).
- ``threads``: ``config["threads"]`` threads, released together, each making ``config["cycles"]``
  one-attempt acquisitions of keys of their own (the sync API), holding ``config["hold"]``.
- ``waiters``: warm up, print ``ready``, wait for ``go``; then ``config["waiters"]`` tasks ask for
  ONE key (``config["key"]``, held by a ``hold`` process) with ``wait=config["wait"]``, one after
  the other (each records its arrival, then asks; the next starts once it is waiting). Prints
  ``arrived`` with ``release_at`` = arrival + ``config["hold_for"]``: when the holder is to let go;
  then, once every waiter has got the lock (releasing it at once) or given up, what happened.
- ``hold``: take ``config["key"]`` with the implementation's sync lock, print ``held``, wait for a
  line ``release_at <monotonic seconds>``, release then, print ``released``.

Connections: ``Census`` counts, on each master, the ``CLIENT LIST`` entries whose client port is
one of this process's own TCP sockets (``/proc/self/fd`` -> ``/proc/net/tcp``), without its own
admin connection and without pub/sub ones (``sub``/``psub``/``ssub`` > 0 or a subscribe command):
the lock path. A thread samples it every ``config["interval"]`` seconds while callers run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from worker import IMPLEMENTATIONS, Failed, Impl, error_text, reply

PUBSUB_COMMANDS = {"subscribe", "psubscribe", "ssubscribe"}


# --- who is connected -------------------------------------------------------------------------


def own_ports() -> set[int]:
    """Local ports of this process's TCP sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Census:
    """Lock-path and pub/sub connections from this process on each master, and its open file
    descriptors: sampled by a thread while callers run, and once at the end; the peaks kept."""

    def __init__(self, urls: list[str], interval: float) -> None:
        import redis

        self.admins = [redis.Redis.from_url(url, socket_timeout=5) for url in urls]
        self.admin_ids = [admin.client_id() for admin in self.admins]
        self.interval = interval
        self.fds_before = open_fds()
        self.peak = {"lock": 0, "pubsub": 0, "fds": 0}
        self.last = dict(self.peak)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self) -> dict[str, int]:
        """One sample: the most lock-path and pub/sub connections on any master, and the fds."""
        lists = [admin.client_list() for admin in self.admins]
        mine = own_ports()
        lock = pubsub = 0
        for clients, admin_id in zip(lists, self.admin_ids, strict=True):
            on_master = [
                c
                for c in clients
                if int(c["id"]) != admin_id and int(c["addr"].rsplit(":", 1)[1]) in mine
            ]
            subscribed = [c for c in on_master if is_pubsub(c)]
            lock = max(lock, len(on_master) - len(subscribed))
            pubsub = max(pubsub, len(subscribed))
        self.last = {"lock": lock, "pubsub": pubsub, "fds": open_fds()}
        self.peak = {k: max(v, self.last[k]) for k, v in self.peak.items()}
        return self.last

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):  # a failed sample is only a missed sample
                self.take()

    @contextlib.contextmanager
    def sampling(self) -> Any:
        """Sample in a thread for the duration; then once more (the ``after`` figures)."""
        self.peak = {"lock": 0, "pubsub": 0, "fds": 0}
        self._stop.clear()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join()
            self.take()

    def figures(self) -> dict[str, int]:
        return {
            "conns_peak": self.peak["lock"],
            "conns_after": self.last["lock"],
            "pubsub_peak": self.peak["pubsub"],
            "fds_before": self.fds_before,
            "fds_peak": self.peak["fds"],
            "fds_after": self.last["fds"],
        }

    def close(self) -> None:
        for admin in self.admins:
            admin.close()


def is_pubsub(client: dict[str, Any]) -> bool:
    counts = (int(client.get(flag, 0) or 0) for flag in ("sub", "psub", "ssub"))
    return any(n > 0 for n in counts) or client.get("cmd", "") in PUBSUB_COMMANDS


# --- async implementations --------------------------------------------------------------------


class Aio(Protocol):
    """An async lock implementation. ``held(key, wait)``: an async context manager holding the
    lock on ``key`` for its body; raises if it could not get it within ``wait`` seconds (0: one
    attempt)."""

    urls: list[str]  # the masters it talks to

    def held(self, key: str, wait: float) -> contextlib.AbstractAsyncContextManager[Any]: ...

    async def aclose(self) -> None: ...


class OursAio:
    """django_redlock: ``async with Redlock(urls).lock(key, ttl=10, wait=w):``."""

    def __init__(self, config: dict[str, Any]) -> None:
        from django_redlock.engine import Redlock

        self.urls: list[str] = config["urls"]
        self.ttl = config["ttl"]
        self.engine = Redlock(self.urls, node_timeout=config.get("timeout") or 0.05)

    def held(self, key: str, wait: float) -> contextlib.AbstractAsyncContextManager[Any]:
        return self.engine.lock(key, ttl=self.ttl, wait=wait)

    async def aclose(self) -> None:
        self.engine.close()


class YesNoAio:
    """A peer whose lock object answers ``acquire(...)`` with True or False and has an awaitable
    ``release()``: ``lock(key)`` makes the object, ``acquire(lock, wait)`` asks."""

    def lock(self, key: str) -> Any:
        raise NotImplementedError

    async def acquire(self, lock: Any, wait: float) -> bool:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def held(self, key: str, wait: float) -> AsyncIterator[None]:
        lock = self.lock(key)
        if not await self.acquire(lock, wait):
            raise Failed("acquire() returned False")
        try:
            yield
        finally:
            await lock.release()


class RedisPyAio(YesNoAio):
    """redis-py ``redis.asyncio`` ``Redis.lock(key, timeout=10)`` on the first master only, its
    pool's default size (100) unless ``config["max_connections"]``; waiting: it polls every
    100 ms (its default)."""

    def __init__(self, config: dict[str, Any]) -> None:
        import redis.asyncio

        self.urls = config["urls"][:1]
        self.ttl = config["ttl"]
        pool = {k: config[k] for k in ("max_connections",) if config.get(k)}
        self.client = redis.asyncio.Redis.from_url(self.urls[0], **pool)

    def lock(self, key: str) -> Any:
        return self.client.lock(key, timeout=self.ttl)

    async def acquire(self, lock: Any, wait: float) -> bool:
        if wait:
            return bool(await lock.acquire(blocking_timeout=wait))
        return bool(await lock.acquire(blocking=False))

    async def aclose(self) -> None:
        await self.client.aclose()


class PotteryAio(YesNoAio):
    """pottery ``AIORedlock(key, masters=<5 redis.asyncio clients>, auto_release_time=10)``."""

    def __init__(self, config: dict[str, Any]) -> None:
        import redis.asyncio

        self.urls = config["urls"]
        self.ttl = config["ttl"]
        self.clients = {redis.asyncio.Redis.from_url(url) for url in self.urls}

    def lock(self, key: str) -> Any:
        import pottery

        return pottery.AIORedlock(key=key, masters=self.clients, auto_release_time=self.ttl)

    async def acquire(self, lock: Any, wait: float) -> bool:
        return bool(await (lock.acquire(timeout=wait) if wait else lock.acquire(blocking=False)))

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()


class RedlockNgAio:
    """redlock-ng ``AsyncRedlock(RedlockConfig(masters=urls), retry_count=0)`` (its socket
    budget, 0.1 s); waiting: ``acquire(blocking=True)`` (retries every 100-300 ms, forever)
    inside ``asyncio.wait_for(..., wait)``."""

    def __init__(self, config: dict[str, Any]) -> None:
        from redlock import AsyncRedlock, RedlockConfig

        self.urls = config["urls"]
        self.ttl_ms = int(config["ttl"] * 1000)
        self.dlm = AsyncRedlock(RedlockConfig(masters=self.urls), retry_count=0)

    @contextlib.asynccontextmanager
    async def held(self, key: str, wait: float) -> AsyncIterator[None]:
        if wait:
            got = await asyncio.wait_for(self.dlm.acquire(key, self.ttl_ms, blocking=True), wait)
        else:
            got = await self.dlm.acquire(key, self.ttl_ms)
        if got is None:
            raise Failed("acquire() returned None")
        try:
            yield
        finally:
            await self.dlm.release(got)

    async def aclose(self) -> None:
        for client in self.dlm.client.instances:
            await client.aclose()


ASYNC: dict[str, Callable[[dict[str, Any]], Aio]] = {
    "ours": OursAio,
    "redis-py-lock": RedisPyAio,
    "pottery": PotteryAio,
    "redlock-ng-async": RedlockNgAio,
}


# --- outcomes ---------------------------------------------------------------------------------


class Outcome:
    """Latencies of the acquisitions that succeeded; failures counted by error class, with the
    first message of each class."""

    def __init__(self) -> None:
        self.acquired_ns: list[int] = []
        self.failed_ns: list[int] = []
        self.errors: dict[str, list[Any]] = {}  # class -> [count, first message]
        self.release_errors = 0

    def failed(self, exc: BaseException, after_ns: int) -> None:
        self.failed_ns.append(after_ns)
        entry = self.errors.setdefault(type(exc).__name__, [0, str(exc)[:160]])
        entry[0] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "acquired_ns": self.acquired_ns,
            "failed_ns": self.failed_ns,
            "errors": self.errors,
            "release_errors": self.release_errors,
        }


# --- modes ------------------------------------------------------------------------------------


async def burst_once(aio: Aio, prefix: str, tasks: int, hold: float) -> dict[str, Any]:
    outcome = Outcome()
    clock = time.perf_counter_ns

    async def one(key: str) -> None:
        start = clock()
        got = 0
        try:
            async with aio.held(key, 0):
                got = clock()
                outcome.acquired_ns.append(got - start)
                await asyncio.sleep(hold)
        except Exception as exc:  # noqa: BLE001 (a failure is a result to report)
            if got:
                outcome.release_errors += 1
            else:
                outcome.failed(exc, clock() - start)

    start = clock()
    await asyncio.gather(*(one(f"{prefix}{i}") for i in range(tasks)))
    return {**outcome.as_dict(), "wall_ns": clock() - start}


async def burst(name: str, config: dict[str, Any]) -> None:
    aio = ASYNC[name](config)
    census = Census(aio.urls, config["interval"])
    try:
        for phase in ("cold", "warm"):
            with census.sampling():
                result = await burst_once(
                    aio, f"{config['key']}:{phase}:", config["tasks"], config["hold"]
                )
            reply({"phase": phase, **result, **census.figures()})
            await asyncio.sleep(0.2)  # let the first burst's stragglers settle
    finally:
        await aio.aclose()
        census.close()


def threads(name: str, config: dict[str, Any]) -> None:
    impl = IMPLEMENTATIONS[name](config)
    census = Census(impl.urls, config["interval"])
    outcome = Outcome()
    guard = threading.Lock()
    count, cycles, hold = config["threads"], config["cycles"], config["hold"]
    gate = threading.Barrier(count + 1)
    clock = time.perf_counter_ns

    def caller(t: int) -> None:
        gate.wait()
        for c in range(cycles):
            start = clock()
            try:
                handle = impl.acquire(f"{config['key']}:{t}:{c}")
            except Exception as exc:  # noqa: BLE001
                with guard:
                    outcome.failed(exc, clock() - start)
                continue
            got = clock()
            time.sleep(hold)
            try:
                impl.release(handle)
            except Exception:  # noqa: BLE001
                with guard:
                    outcome.release_errors += 1
            with guard:
                outcome.acquired_ns.append(got - start)

    workers = [threading.Thread(target=caller, args=(t,)) for t in range(count)]
    for worker in workers:
        worker.start()
    with census.sampling():
        start = clock()
        gate.wait()
        for worker in workers:
            worker.join()
        wall = clock() - start
    reply({**outcome.as_dict(), "wall_ns": wall, **census.figures()})
    impl.close()
    census.close()


async def waiters(name: str, config: dict[str, Any]) -> None:
    aio = ASYNC[name](config)
    await warm_up(aio, f"{config['key']}:warm-up")
    reply({"ready": True})
    if (await asyncio.to_thread(sys.stdin.readline)).strip() != "go":
        return
    n, wait, key = config["waiters"], config["wait"], config["key"]
    clock = time.monotonic_ns
    arrived = [0] * n
    got = [0] * n
    outcome = Outcome()

    async def waiter(i: int) -> None:
        arrived[i] = clock()
        try:
            async with aio.held(key, wait):
                got[i] = clock()
        except Exception as exc:  # noqa: BLE001
            if got[i]:
                outcome.release_errors += 1
            else:
                outcome.failed(exc, clock() - arrived[i])

    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(waiter(i)))
        await asyncio.sleep(0)  # waiter i runs up to its first wait before i + 1 is made
    window_start = (time.process_time(), time.monotonic())
    release_at = window_start[1] + config["hold_for"]
    reply({"arrived": clock(), "release_at": release_at})
    window_end: list[float] = []

    def at_release() -> None:  # this process's CPU time while every waiter waits
        time.sleep(max(0.0, release_at - time.monotonic()))
        window_end.extend((time.process_time(), time.monotonic()))

    sampler = threading.Thread(target=at_release)
    sampler.start()
    await asyncio.gather(*tasks)
    sampler.join()
    cpu = (window_end[0] - window_start[0]) / (window_end[1] - window_start[1])
    await aio.aclose()
    reply({**outcome.as_dict(), "arrived_ns": arrived, "got_ns": got, "cpu_share": cpu})


async def warm_up(aio: Aio, key: str) -> None:
    """Connections open, scripts loaded, before the measured part. A few tries: on a loaded
    machine one round can miss its budget."""
    for attempt in range(5):
        try:
            async with aio.held(f"{key}:{attempt}", 0):
                return
        except Exception:  # noqa: BLE001
            if attempt == 4:
                raise
            await asyncio.sleep(0.1)


def hold(name: str, config: dict[str, Any]) -> None:
    impl: Impl = IMPLEMENTATIONS[name](config)
    for attempt in range(5):
        try:
            handle = impl.acquire(config["key"])
            break
        except Exception as exc:  # noqa: BLE001
            if attempt == 4:
                reply({"error": f"the holder could not take the key: {error_text(exc)}"})
                return
            time.sleep(0.1)
    reply({"held": time.monotonic_ns()})
    line = sys.stdin.readline().split()
    if line[:1] == ["release_at"]:
        time.sleep(max(0.0, float(line[1]) - time.monotonic()))
    released = time.monotonic_ns()
    impl.release(handle)
    reply({"released": released})
    impl.close()


MODES: dict[str, Callable[[str, dict[str, Any]], object]] = {
    "burst": lambda name, config: asyncio.run(burst(name, config)),
    "threads": threads,
    "waiters": lambda name, config: asyncio.run(waiters(name, config)),
    "hold": hold,
}


def main() -> None:
    # Peers log every failed master call; their failures are counted from what they raise.
    logging.disable(logging.CRITICAL)
    mode, name, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}")
    MODES[mode](name, config)


if __name__ == "__main__":
    main()
