"""One shape for every lock implementation the benchmark measures: run N acquire+release cycles
on one resource and time each cycle. Adapters for the peer libraries live here; our engine and the
raw floor are in ``cycle.py``.

Peers are used the way their documentation shows, with their own defaults, except where a scenario
says otherwise (``timeout``: a bounded socket budget and no retries, the settings our engine uses,
so that a paused master costs them a budget instead of their default of waiting forever).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pottery
import redis
import redis_lock  # type: ignore[import-untyped]
import redlock  # type: ignore[import-untyped]
from redis.backoff import NoBackoff
from redis.retry import Retry

#: Where one master listens: (host, port).
Address = tuple[str, int]


@dataclass
class Batch:
    """Timings of the cycles that completed, and what went wrong in the others."""

    times_ns: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def add(self, other: Batch) -> None:
        self.times_ns.extend(other.times_ns)
        self.errors.extend(other.errors)


class Contender(Protocol):
    """Something whose acquire+release cycle we time."""

    name: str  # the row label
    meaning: str  # one line: what exactly the row measures

    def run(self, cycles: int) -> Batch: ...

    def close(self) -> None: ...


class CycleFailed(Exception):
    """A peer reported failure by a return value instead of an exception."""


def timed(cycle: Callable[[], None], cycles: int) -> Batch:
    """Run ``cycle`` ``cycles`` times; time each completed one on the monotonic clock."""
    batch = Batch()
    clock = time.perf_counter_ns
    for _ in range(cycles):
        start = clock()
        try:
            cycle()
        except Exception as exc:  # noqa: BLE001 (a peer's failure is a result to report)
            batch.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            continue
        batch.times_ns.append(clock() - start)
    return batch


def client_kwargs(timeout: float | None) -> dict[str, Any]:
    """redis-py client settings: its defaults, or a bounded budget with no retries."""
    if timeout is None:
        return {}
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "retry": Retry(NoBackoff(), 0),
    }


class PotteryRedlock:
    name = "pottery"
    meaning = (
        "pottery.Redlock over the 5 masters: acquire()+release(); one thread per master per "
        "round, returns as soon as a quorum answered"
    )

    def __init__(
        self, addresses: Sequence[Address], resource: str, *, timeout: float | None = None
    ) -> None:
        self._clients = [
            redis.Redis(host=host, port=port, **client_kwargs(timeout)) for host, port in addresses
        ]
        self._lock = pottery.Redlock(key=resource, masters=set(self._clients), auto_release_time=10)

    def _cycle(self) -> None:
        # blocking=False: the same single attempt as blocking=True when uncontended, but a
        # failure reports instead of retrying forever.
        if not self._lock.acquire(blocking=False):
            raise CycleFailed("acquire() returned False")
        self._lock.release()

    def run(self, cycles: int) -> Batch:
        return timed(self._cycle, cycles)

    def close(self) -> None:
        for client in self._clients:
            client.close()


class RedlockPy:
    name = "redlock-py"
    meaning = (
        "redlock-py Redlock over the 5 masters: lock()+unlock(); asks the masters one after "
        "the other, EVAL (full script source) for unlock"
    )

    def __init__(
        self,
        addresses: Sequence[Address],
        resource: str,
        *,
        timeout: float | None = None,
        fresh_resource_each_cycle: bool = False,
    ) -> None:
        self._dlm = redlock.Redlock(
            [{"host": host, "port": port, **client_kwargs(timeout)} for host, port in addresses]
        )
        self._resource = resource
        # lock() raises when any master errs, even after winning a quorum, and the keys it set
        # stay until their TTL: under a fault, each cycle needs its own resource.
        self._fresh = fresh_resource_each_cycle
        self._count = 0

    def _cycle(self) -> None:
        self._count += 1
        resource = f"{self._resource}:{self._count}" if self._fresh else self._resource
        held = self._dlm.lock(resource, 10_000)
        if not held:
            raise CycleFailed("lock() returned False")
        self._dlm.unlock(held)

    def run(self, cycles: int) -> Batch:
        return timed(self._cycle, cycles)

    def close(self) -> None:
        for server in self._dlm.servers:
            server.close()


class RedisPyLock:
    name = "single: redis-py Lock"
    meaning = "redis-py Redis.lock(timeout=10) on ONE master: acquire()+release() (reference)"

    def __init__(self, address: Address, resource: str) -> None:
        self._client = redis.Redis(host=address[0], port=address[1])
        self._lock = self._client.lock(resource, timeout=10)

    def _cycle(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise CycleFailed("acquire() returned False")
        self._lock.release()

    def run(self, cycles: int) -> Batch:
        return timed(self._cycle, cycles)

    def close(self) -> None:
        self._client.close()


class PythonRedisLock:
    name = "single: python-redis-lock"
    meaning = "python-redis-lock Lock(expire=10) on ONE master: acquire()+release() (reference)"

    def __init__(self, address: Address, resource: str) -> None:
        self._client = redis.Redis(host=address[0], port=address[1])
        self._lock = redis_lock.Lock(self._client, resource, expire=10)

    def _cycle(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise CycleFailed("acquire() returned False")
        self._lock.release()

    def run(self, cycles: int) -> Batch:
        return timed(self._cycle, cycles)

    def close(self) -> None:
        self._client.close()
