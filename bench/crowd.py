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
  the other (each records its arrival, then asks; the next starts once it waits). Prints
  ``arrived`` with ``release_at`` = arrival + ``config["hold_for"]``: when the holder is to let go;
  then, once every waiter has got the lock (releasing it at once) or given up, what happened.
- ``hold``: take ``config["key"]`` with the implementation's sync lock, print ``held``, wait for a
  line ``release_at <monotonic seconds>``, release then, print ``released``.

``burst`` and ``threads`` say ``ready`` and wait for ``go`` before each measured part, and after
the last one wait for the end of their input before closing anything: the parent counts this
process's connections and file descriptors from outside (``census.py``), during and after each
part, so that counting takes nothing from the callers measured here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from worker import IMPLEMENTATIONS, Failed, Impl, error_text, reply


def ready_then_go(**state: Any) -> bool:
    """Say ``ready`` (with ``state``), then wait for the parent's ``go`` line (it counts this
    process's connections from outside, before and after each measured part)."""
    reply({"ready": True, **state})
    return sys.stdin.readline().strip() == "go"


#: Reads stdin for the event loop: a thread of its own, so that the loop's default executor (which
#: a library may use, e.g. to connect) is neither made early nor kept busy by it.
_STDIN = ThreadPoolExecutor(1, thread_name_prefix="stdin")


async def aready_then_go(**state: Any) -> bool:
    call = functools.partial(ready_then_go, **state)
    return await asyncio.get_running_loop().run_in_executor(_STDIN, call)


async def until_input_ends() -> None:
    await asyncio.get_running_loop().run_in_executor(_STDIN, sys.stdin.read)


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
        self.release_kinds: dict[str, list[Any]] = {}  # the same, for failed releases

    def failed(self, exc: BaseException, after_ns: int) -> None:
        self.failed_ns.append(after_ns)
        entry = self.errors.setdefault(type(exc).__name__, [0, str(exc)[:240]])
        entry[0] += 1

    def release_failed(self, exc: BaseException) -> None:
        self.release_errors += 1
        kind = type(exc).__name__
        if getattr(exc, "unconfirmed", False):
            kind += "(unconfirmed)"
        entry = self.release_kinds.setdefault(kind, [0, str(exc)[:240]])
        entry[0] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "acquired_ns": self.acquired_ns,
            "failed_ns": self.failed_ns,
            "errors": self.errors,
            "release_errors": self.release_errors,
            "release_kinds": self.release_kinds,
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
                outcome.release_failed(exc)
            else:
                outcome.failed(exc, clock() - start)

    start = clock()
    await asyncio.gather(*(one(f"{prefix}{i}") for i in range(tasks)))
    return {**outcome.as_dict(), "wall_ns": clock() - start}


async def burst(name: str, config: dict[str, Any]) -> None:
    aio = ASYNC[name](config)
    try:
        for phase in ("cold", "warm"):
            if not await aready_then_go(phase=phase):
                return
            result = await burst_once(
                aio, f"{config['key']}:{phase}:", config["tasks"], config["hold"]
            )
            reply({"phase": phase, **result})
        await until_input_ends()  # the parent has counted what is left
    finally:
        await aio.aclose()


def threads(name: str, config: dict[str, Any]) -> None:
    impl = IMPLEMENTATIONS[name](config)
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
            except Exception as exc:  # noqa: BLE001
                with guard:
                    outcome.release_failed(exc)
            with guard:
                outcome.acquired_ns.append(got - start)

    workers = [threading.Thread(target=caller, args=(t,)) for t in range(count)]
    for worker in workers:
        worker.start()
    go = ready_then_go()
    start = clock()
    gate.wait()  # also when not ``go``: the threads end with their cycles either way
    for worker in workers:
        worker.join()
    wall = clock() - start
    if go:
        reply({**outcome.as_dict(), "wall_ns": wall})
        sys.stdin.read()  # until the input ends: the parent has counted what is left
    impl.close()


async def waiters(name: str, config: dict[str, Any]) -> None:
    aio = ASYNC[name](config)
    await warm_up(aio, f"{config['key']}:warm-up")
    if not await aready_then_go():
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

    # Arrival order = index order: the tasks' first steps run one after the other, in the order
    # they were made, in the loop's next pass; each records its arrival and asks, up to its first
    # wait, before the next one starts. (Yielding to the loop between creations would also
    # run every earlier waiter's polling in between: with 2,000 of them, arrivals took a minute.)
    tasks = [asyncio.create_task(waiter(i)) for i in range(n)]
    await asyncio.sleep(0)  # back here after all of them have asked
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
