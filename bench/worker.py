"""One lock implementation in a process of its own, driven by the benchmark over pipes.

Run by path, ``python bench/worker.py <mode> <implementation> <config json>``, by any virtual
environment: the benchmark's own (``.venv``) or the one made for redlock-ng (whose ``redlock``
module would clash with redlock-py's). So this file imports only the standard library at the top;
each implementation imports its library when it is built.

Modes:

- ``serve``: answers one JSON request per stdin line with one JSON line on stdout:
  ``{"op": "cycles", "n": N}`` -> ``{"times_ns": [...], "errors": [...]}`` (N uncontended
  acquire+release cycles on ``config["key"]``, each timed on its own);
  ``{"op": "hold", "n": N, "prefix": P}`` -> ``{"client_bytes": B, "held": k, "errors": [...]}``
  (acquire N locks ``P0 .. P{N-1}`` and keep them; B is what tracemalloc saw allocated for them);
  ``{"op": "drop"}`` -> ``{"released": k}``; end of input ends the worker.
- ``contend``: prints ``{"ready": true}`` once connected and warm (``config["cold"]``: once built,
  without connecting), waits for one ``go`` line, then makes ``config["count"]`` blocking
  acquisitions of ``config["key"]``, holding each ``config["hold"]`` seconds, and prints what
  happened as one JSON line (monotonic nanoseconds; ``CLOCK_MONOTONIC`` is one clock for every
  process on the machine, so the parent can merge the timelines of all workers).

- ``fleet`` (scenario i, ``bench/fleet_cycles.py``): prints ``{"ready": true}`` once warm, waits
  for ``go``, then cycles keys of its own for ``config["duration"]`` seconds and reports its
  cycles, failures and CPU time.
- ``idle`` (``bench/connections.py``): does ``config["what"]`` once, prints ready and keeps its
  connections open until stdin ends, for the masters to be counted.

``ours-django`` and ``django-redis`` configure Django in the worker process (``settings.
configure``), as a project's settings would: ours through ``django_redlock.redlock()``,
django-redis through ``cache.lock()``.

``config``: ``urls`` (the masters), ``ttl`` (seconds), ``timeout`` (per-request socket budget in
seconds, or null for the library's default), and the mode's keys above.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import json
import os
import secrets
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

#: How long our engine may wait for a contended lock in ``contend`` mode: generous, so that every
#: acquisition succeeds and the scenario measures waiting, not giving up.
OURS_WAIT = 60.0


class Failed(Exception):
    """An implementation said no by a return value instead of an exception."""


class Impl:
    """What the worker needs from a lock implementation. ``acquire`` is one attempt (returns a
    handle or raises ``Failed``), ``acquire_blocking`` waits until it holds the lock."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.urls: list[str] = config["urls"]
        self.ttl: float = config.get("ttl", 10.0)
        self.timeout: float | None = config.get("timeout")

    def acquire(self, key: str) -> Any:
        raise NotImplementedError

    def acquire_blocking(self, key: str) -> Any:
        raise NotImplementedError

    def release(self, handle: Any) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 6379


def redis_kwargs(timeout: float | None) -> dict[str, Any]:
    """A bounded budget and no retries (what our engine uses), or redis-py's defaults."""
    if timeout is None:
        return {}
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }


# --- implementations --------------------------------------------------------------------------


class Floor(Impl):
    """For memory only: what a client must keep per held lock (key and token) and what a master
    must store (``SET key <32 hex> NX PX``). Sequential: its speed is measured in-process."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import redis

        self.clients = [redis.Redis.from_url(u) for u in self.urls]
        self.release_script = self.clients[0].register_script(
            "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) "
            "end return 0"
        )

    def acquire(self, key: str) -> Any:
        token = secrets.token_hex(16)
        granted = sum(
            bool(c.set(key, token, nx=True, px=int(self.ttl * 1000))) for c in self.clients
        )
        if granted < len(self.clients) // 2 + 1:
            raise Failed(f"{granted} masters granted")
        return (key, token)

    def release(self, handle: Any) -> None:
        for client in self.clients:
            self.release_script(keys=[handle[0]], args=[handle[1]], client=client)

    def close(self) -> None:
        for client in self.clients:
            client.close()


class Ours(Impl):
    """django-redlock's engine (sync): ``Redlock(urls).lock(key, ttl, wait)``."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        from django_redlock.engine import Redlock

        self.redlock = Redlock(self.urls, node_timeout=self.timeout or 0.05)

    def acquire(self, key: str) -> Any:
        return self.redlock.lock(key, ttl=self.ttl).acquire()

    def acquire_blocking(self, key: str) -> Any:
        return self.redlock.lock(key, ttl=self.ttl, wait=OURS_WAIT).acquire()

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        self.redlock.close()


def setup_django(**settings: Any) -> None:
    """Configure Django in this worker process the way a project would (``settings.py``), for
    the rows that go through Django: ours by ``django_redlock.redlock()`` and django-redis."""
    import django
    from django.conf import settings as django_settings

    django_settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        **settings,
    )
    django.setup()


class OursDjango(Impl):
    """django-redlock the way a Django project calls it: ``redlock(key, ttl, wait)`` over
    ``settings.REDLOCK["NODES"]``, with the app installed (observer, signals, metrics and the DB
    guard on, as by default)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        setup_django(
            INSTALLED_APPS=["django_redlock"],
            REDLOCK={"NODES": self.urls, "NODE_TIMEOUT": self.timeout or 0.05},
        )
        from django_redlock import redlock

        self.redlock = redlock

    def acquire(self, key: str) -> Any:
        lock = self.redlock(key, ttl=self.ttl, wait=0)
        lock.acquire()
        return lock

    def acquire_blocking(self, key: str) -> Any:
        lock = self.redlock(key, ttl=self.ttl, wait=OURS_WAIT)
        lock.acquire()
        return lock

    def release(self, handle: Any) -> None:
        handle.release()


class DjangoRedis(Impl):
    """django-redis ``cache.lock(key, timeout=ttl)`` on the first master only (single node): a
    redis-py ``Lock`` from the cache's client, blocking by polling every 100 ms."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        options: dict[str, Any] = {}
        if self.timeout is not None:
            options = {"SOCKET_TIMEOUT": self.timeout, "SOCKET_CONNECT_TIMEOUT": self.timeout}
        setup_django(
            INSTALLED_APPS=[],
            CACHES={
                "default": {
                    "BACKEND": "django_redis.cache.RedisCache",
                    "LOCATION": self.urls[0],
                    "OPTIONS": options,
                }
            },
        )
        from django.core.cache import cache

        self.cache = cache

    def acquire(self, key: str) -> Any:
        lock = self.cache.lock(key, timeout=self.ttl)  # type: ignore[attr-defined]
        if not lock.acquire(blocking=False):
            raise Failed("acquire() returned False")
        return lock

    def acquire_blocking(self, key: str) -> Any:
        lock = self.cache.lock(key, timeout=self.ttl)  # type: ignore[attr-defined]
        lock.acquire()  # blocking, polls every 100 ms (redis-py's Lock, its default)
        return lock

    def release(self, handle: Any) -> None:
        handle.release()


class Timeline:
    """What one of our workers did in each hand-off (``config["breakdown"]``), for scenario
    (c)'s breakdown: every step the engine's sync driver performed (a round, a pause, a wait
    for a notice or for the local turn) with its start and end, and when the process read
    each release notice. Installed by wrapping the driver's ``_perform`` and the
    notices' ``deliver`` in this worker only: the engine is not changed for the bench."""

    def __init__(self) -> None:
        from django_redlock.engine.algorithm.steps import AwaitNotice, AwaitTurn, Pause, Round
        from django_redlock.engine.running import drivers
        from django_redlock.engine.waiting.notices import ReleaseNotices

        self.steps: list[tuple[str, int, int]] = []
        self.notices: list[int] = []
        clock = time.monotonic_ns
        perform, deliver = drivers._perform, ReleaseNotices.deliver  # noqa: SLF001

        def kind(step: Any) -> str:
            if isinstance(step, Round):
                return (
                    "round:"
                    + str(step.command[0]).lower()
                    + (":" + step.script.name if step.script is not None else "")
                )
            if isinstance(step, Pause):
                return "pause"
            if isinstance(step, AwaitNotice):
                return "notice"
            if isinstance(step, AwaitTurn):
                return "turn"
            return type(step).__name__.lower()

        def timed_perform(masters: Any, step: Any, waiters: Any) -> Any:
            began = clock()
            try:
                return perform(masters, step, waiters)
            finally:
                self.steps.append((kind(step), began, clock()))

        def timed_deliver(hub: Any, notice: bytes, inbox: Any) -> None:
            self.notices.append(clock())
            deliver(hub, notice, inbox)

        drivers._perform = timed_perform  # noqa: SLF001
        ReleaseNotices.deliver = timed_deliver  # type: ignore[method-assign,assignment]


class Pottery(Impl):
    """pottery ``Redlock`` over every master, one object per resource as its docs show."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import redis

        self.clients = {redis.Redis.from_url(u, **redis_kwargs(self.timeout)) for u in self.urls}

    def _lock(self, key: str) -> Any:
        import pottery

        return pottery.Redlock(key=key, masters=self.clients, auto_release_time=self.ttl)

    def acquire(self, key: str) -> Any:
        lock = self._lock(key)
        if not lock.acquire(blocking=False):
            raise Failed("acquire() returned False")
        return lock

    def acquire_blocking(self, key: str) -> Any:
        lock = self._lock(key)
        lock.acquire()  # blocking=True, timeout=-1: its default, retries every 0-200 ms
        return lock

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        for client in self.clients:
            client.close()


class RedlockPy(Impl):
    """redlock-py: ``Redlock([{host, port}...]).lock(resource, ttl_ms)`` (3 tries, 200 ms apart,
    then False: a blocking acquisition calls it again until it wins)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import redlock  # type: ignore[import-untyped]

        self.dlm = redlock.Redlock(
            [
                {"host": h, "port": p, **redis_kwargs(self.timeout)}
                for h, p in map(host_port, self.urls)
            ]
        )

    def acquire(self, key: str) -> Any:
        held = self.dlm.lock(key, int(self.ttl * 1000))
        if not held:
            raise Failed("lock() returned False")
        return held

    def acquire_blocking(self, key: str) -> Any:
        while True:
            held = self.dlm.lock(key, int(self.ttl * 1000))
            if held:
                return held

    def release(self, handle: Any) -> None:
        self.dlm.unlock(handle)

    def close(self) -> None:
        for server in self.dlm.servers:
            server.close()


class RedlockNg(Impl):
    """redlock-ng (sync): ``Redlock(RedlockConfig(masters=urls))``; asks the masters one after
    the other. One attempt: ``retry_count=0``; blocking: its own loop, 100-300 ms apart."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        from redlock import Redlock, RedlockConfig

        budget = {} if self.timeout is None else {"socket_timeout": self.timeout}
        if self.timeout is not None:
            budget["socket_connect_timeout"] = self.timeout
        self.config = RedlockConfig(masters=self.urls, **budget)
        self.once = Redlock(self.config, retry_count=0)
        self.blocking = Redlock(self.config)

    def acquire(self, key: str) -> Any:
        held = self.once.acquire(key, int(self.ttl * 1000))
        if held is None:
            raise Failed("acquire() returned None")
        return held

    def acquire_blocking(self, key: str) -> Any:
        return self.blocking.acquire(key, int(self.ttl * 1000), blocking=True)

    def release(self, handle: Any) -> None:
        self.once.release(handle)

    def close(self) -> None:
        for redlock in (self.once, self.blocking):
            for client in redlock.client.instances:
                client.close()


class RedisPyLock(Impl):
    """redis-py ``Redis.lock(name, timeout=ttl)`` on the first master only (single node)."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import redis

        self.client = redis.Redis.from_url(self.urls[0], **redis_kwargs(self.timeout))

    def acquire(self, key: str) -> Any:
        lock = self.client.lock(key, timeout=self.ttl)
        if not lock.acquire(blocking=False):
            raise Failed("acquire() returned False")
        return lock

    def acquire_blocking(self, key: str) -> Any:
        lock = self.client.lock(key, timeout=self.ttl)
        lock.acquire()  # blocking, polls every 100 ms (its default)
        return lock

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        self.client.close()


class PythonRedisLock(Impl):
    """python-redis-lock ``Lock(client, name, expire=ttl)`` on the first master only (single
    node); a release pushes to a list that a blocked waiter BLPOPs."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        import redis

        self.client = redis.Redis.from_url(self.urls[0], **redis_kwargs(self.timeout))

    def _lock(self, key: str) -> Any:
        import redis_lock  # type: ignore[import-untyped]

        return redis_lock.Lock(self.client, key, expire=int(self.ttl))

    def acquire(self, key: str) -> Any:
        lock = self._lock(key)
        if not lock.acquire(blocking=False):
            raise Failed("acquire() returned False")
        return lock

    def acquire_blocking(self, key: str) -> Any:
        lock = self._lock(key)
        lock.acquire()
        return lock

    def release(self, handle: Any) -> None:
        handle.release()

    def close(self) -> None:
        self.client.close()


IMPLEMENTATIONS: dict[str, Callable[[dict[str, Any]], Impl]] = {
    "floor": Floor,
    "ours": Ours,
    "ours-django": OursDjango,
    "django-redis": DjangoRedis,
    "pottery": Pottery,
    "redlock-py": RedlockPy,
    "redlock-ng": RedlockNg,
    "redis-py-lock": RedisPyLock,
    "python-redis-lock": PythonRedisLock,
}


# --- async implementations (uncontended cycles only) ------------------------------------------


def async_cycle(name: str, config: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    """One uncontended acquire+release cycle of an async implementation, inside one loop."""
    if name != "redlock-ng-async":
        raise ValueError(f"no async implementation {name!r}")
    from redlock import AsyncRedlock, RedlockConfig

    budget: dict[str, float] = {}
    if config.get("timeout") is not None:
        budget = {"socket_timeout": config["timeout"], "socket_connect_timeout": config["timeout"]}
    redlock = AsyncRedlock(RedlockConfig(masters=config["urls"], **budget), retry_count=0)
    key, ttl_ms = config["key"], int(config.get("ttl", 10.0) * 1000)

    async def cycle() -> None:
        held = await redlock.acquire(key, ttl_ms)
        if held is None:
            raise Failed("acquire() returned None")
        await redlock.release(held)

    return cycle


# --- modes ------------------------------------------------------------------------------------


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


def cycle(impl: Impl, key: str) -> None:
    impl.release(impl.acquire(key))


def timed_cycles(cycle: Callable[[], None], n: int) -> dict[str, list[Any]]:
    times: list[int] = []
    errors: list[str] = []
    clock = time.perf_counter_ns
    for _ in range(n):
        start = clock()
        try:
            cycle()
        except Exception as exc:  # noqa: BLE001 (a failed cycle is a result to report)
            errors.append(error_text(exc))
            continue
        times.append(clock() - start)
    return {"times_ns": times, "errors": errors}


async def atimed_cycles(cycle: Callable[[], Awaitable[None]], n: int) -> dict[str, list[Any]]:
    times: list[int] = []
    errors: list[str] = []
    clock = time.perf_counter_ns
    for _ in range(n):
        start = clock()
        try:
            await cycle()
        except Exception as exc:  # noqa: BLE001
            errors.append(error_text(exc))
            continue
        times.append(clock() - start)
    return {"times_ns": times, "errors": errors}


def reply(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve(name: str, config: dict[str, Any]) -> None:
    """Answer ``cycles`` / ``hold`` / ``drop`` requests until stdin ends."""
    runner: asyncio.Runner | None = None
    impl: Impl | None = None
    if name.endswith("-async"):
        runner = asyncio.Runner()  # one loop for every request: connections stay pooled
        acycle = runner.run(_build_async(name, config))
    else:
        impl = IMPLEMENTATIONS[name](config)
    held: list[Any] = []
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "cycles" and runner is not None:
            reply(runner.run(atimed_cycles(acycle, request["n"])))
        elif op == "cycles" and impl is not None:
            reply(timed_cycles(functools.partial(cycle, impl, config["key"]), request["n"]))
        elif op == "hold" and impl is not None:
            reply(hold(impl, request["n"], request["prefix"], held))
        elif op == "drop" and impl is not None:
            for handle in held:
                impl.release(handle)
            reply({"released": len(held)})
            held.clear()
        else:
            reply({"error": f"{name} cannot do {op!r}"})
    if impl is not None:
        impl.close()
    if runner is not None:
        runner.close()


async def _build_async(name: str, config: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    return async_cycle(name, config)  # built inside the loop: redis.asyncio binds to it


def hold(impl: Impl, n: int, prefix: str, held: list[Any]) -> dict[str, Any]:
    """Acquire ``n`` locks and keep them; what the client allocated for them, per tracemalloc.
    Connections are opened (and scripts loaded) by a warm-up lock first, so that only what each
    held lock costs is counted."""
    impl.release(impl.acquire(f"{prefix}warm-up"))
    errors: list[str] = []
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i in range(n):
        try:
            held.append(impl.acquire(f"{prefix}{i}"))
        except Exception as exc:  # noqa: BLE001
            errors.append(error_text(exc))
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return {"client_bytes": after - before, "held": len(held), "errors": errors[:3]}


def contend(name: str, config: dict[str, Any]) -> None:
    """Blocking acquisitions of one key against the other workers, after a ``go`` line; then
    ``{"done": true}``, and the report after a ``report`` line (the parent's, once all are
    done)."""
    impl = IMPLEMENTATIONS[name](config)
    key, count, hold_s = config["key"], config["count"], config["hold"]
    # Warm: connections open, scripts loaded, imports done, so the race measures the lock. A
    # few tries: on a loaded machine one round can miss its budget. Cold (``config["cold"]``):
    # imports only; the first acquisition of the race opens the connections.
    for attempt in range(0 if config.get("cold") else 5):
        try:
            impl.release(impl.acquire(f"{key}:warm-up:{secrets.token_hex(4)}"))
            break
        except Exception:  # noqa: BLE001
            if attempt == 4:
                raise
            time.sleep(0.1)
    timeline = Timeline() if config.get("breakdown") else None
    reply({"ready": True})
    if sys.stdin.readline().strip() != "go":
        return
    clock = time.monotonic_ns
    waits: list[int] = []
    holds: list[tuple[int, int]] = []
    released: list[int] = []
    errors: list[str] = []
    start = clock()
    for _ in range(count):
        asked = clock()
        try:
            handle = impl.acquire_blocking(key)
        except Exception as exc:  # noqa: BLE001
            errors.append(error_text(exc))
            continue
        got = clock()
        time.sleep(hold_s)
        done = clock()
        try:
            impl.release(handle)
        except Exception as exc:  # noqa: BLE001
            errors.append(error_text(exc))
        released.append(clock())
        waits.append(got - asked)
        holds.append((got, done))
    end = clock()
    # Done, but quiet until every worker is: a report (JSON of every step) and an engine's
    # close are milliseconds of CPU on a 2-CPU machine, which the workers still racing would
    # wait behind (their longest waits were this process's exit).
    reply({"done": True})
    sys.stdin.readline()  # "report"
    result = {"start": start, "end": end, "waits_ns": waits, "holds": holds, "errors": errors[:3]}
    if timeline is not None:
        result |= {"released": released, "steps": timeline.steps, "notices": timeline.notices}
    reply(result)
    impl.close()


def fleet(name: str, config: dict[str, Any]) -> None:
    """One process of the fleet (scenario i): after a ``go`` line, acquire and release distinct
    keys (``<prefix><pid>:<n>``, one attempt each) for ``config["duration"]`` seconds; report
    the cycles, the failures and this process's CPU time."""
    impl = IMPLEMENTATIONS[name](config)
    prefix = f"{config['prefix']}{os.getpid()}:"
    for n in range(20):  # warm: connections open, scripts loaded
        with contextlib.suppress(Exception):
            cycle(impl, f"{prefix}warm-up:{n}")
    reply({"ready": True})
    if sys.stdin.readline().strip() != "go":
        return
    cycles = failed = 0
    first_error = ""
    cpu = time.process_time()
    start = time.monotonic_ns()
    deadline = start + int(config["duration"] * 1e9)
    while time.monotonic_ns() < deadline:
        try:
            cycle(impl, f"{prefix}{cycles + failed}")
            cycles += 1
        except Exception as exc:  # noqa: BLE001
            failed += 1
            first_error = first_error or error_text(exc)
    end = time.monotonic_ns()
    cpu = time.process_time() - cpu
    reply(
        {
            "start": start,
            "end": end,
            "cycles": cycles,
            "failed": failed,
            "first_error": first_error,
            "cpu_s": cpu,
        }
    )
    impl.close()


def idle(name: str, config: dict[str, Any]) -> None:
    """For counting connections (``bench.connections``): do ``config["what"]`` once, say
    ready, and keep everything open until stdin ends. ``cycle``: one acquire+release;
    ``sync+async``: one cycle from a thread and one in a long-lived event loop;
    ``auto_extend``: hold a lease that the watchdog renews (ttl 10 s); ``wait``: wait for
    ``config["key"]``, held by someone else (a queued waiter, listening to its inbox)."""
    impl = IMPLEMENTATIONS[name](config)
    what = config["what"]
    held: Any = None
    if what == "cycle":
        cycle(impl, f"{config['key']}:{os.getpid()}")
    elif what == "auto_extend":
        assert isinstance(impl, Ours)  # noqa: S101 (only ours renews leases)
        held = impl.redlock.lock(f"{config['key']}:{os.getpid()}", ttl=10.0, auto_extend=True)
        held.acquire()
    elif what == "sync+async":
        assert isinstance(impl, Ours)  # noqa: S101
        cycle(impl, f"{config['key']}:{os.getpid()}")
        loop = asyncio.new_event_loop()  # a long-lived loop, as an ASGI worker has
        import threading

        threading.Thread(target=loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(
            _async_cycle(impl, f"{config['key']}:{os.getpid()}:async"), loop
        ).result()
    elif what == "wait":
        assert isinstance(impl, Ours)  # noqa: S101
        import threading

        threading.Thread(
            target=functools.partial(impl.acquire_blocking, config["key"]), daemon=True
        ).start()
        time.sleep(0.5)  # long enough to have asked, lost and queued
    reply({"ready": True})
    sys.stdin.read()
    if held is not None:
        with contextlib.suppress(Exception):  # on a loaded machine the lease may be lost
            held.release()


async def _async_cycle(impl: Ours, key: str) -> None:
    lock = impl.redlock.lock(key, ttl=impl.ttl)
    await lock.aacquire()
    await lock.arelease()


def main() -> None:
    mode, name, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if mode == "serve":
        serve(name, config)
    elif mode == "contend":
        contend(name, config)
    elif mode == "fleet":
        fleet(name, config)
    elif mode == "idle":
        idle(name, config)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()
