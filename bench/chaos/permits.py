"""Chaos for semaphores and readers/writer locks: "never more than N valid permits; never a reader
beside a writer", checked by an interval sweep over what the clients recorded, under real faults
(masters paused in turn, masters down) on real redis-server masters.

Each section records (acquired, valid-until, released) on ``time.monotonic()``, read on the safe
side as in ``checkers``: the stretch ``[acquired, min(released, valid_until))`` is when the holder
was entitled to be inside. Two checkers:

- ``over_limit``: the instants at which more than ``limit`` permit stretches are open at once;
- ``beside_writer``: every pair (writer, other holder) whose stretches overlap.

A checker that cannot fail proves nothing: ``NaiveSemaphore`` is a deliberately broken semaphore,
written for this check only (a counter on each master capped at N, a permit valid once a majority
admitted it), which the same faults drive past its limit.
"""

from __future__ import annotations

import random
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from django_redlock.engine import LockLost, LockNotAcquired, Redlock
from django_redlock.testing.masters import LocalMaster
from django_redlock.testing.proxy import DelayProxy


@dataclass(frozen=True, slots=True)
class Stretch:
    """One holder's entitled stretch: a permit, a reader or a writer."""

    kind: str  # "permit", "reader" or "writer"
    acquired: float
    valid_until: float
    released: float

    @property
    def end(self) -> float:
        return min(self.released, self.valid_until)


def over_limit(stretches: Sequence[Stretch], limit: int) -> list[tuple[float, int]]:
    """Sweep the stretches' starts and ends in time order: each (instant, holders) at which
    more than ``limit`` were open at once. An end at the same instant as a start comes first
    (the next holder may start exactly when one let go)."""
    events = sorted(
        [(s.acquired, 1) for s in stretches if s.end > s.acquired]
        + [(s.end, -1) for s in stretches if s.end > s.acquired]
    )
    found, open_now = [], 0
    for instant, change in events:
        open_now += change
        if open_now > limit:
            found.append((instant, open_now))
    return found


def beside_writer(stretches: Sequence[Stretch]) -> list[tuple[Stretch, Stretch]]:
    """Every (writer, other) pair whose stretches overlap (touching is not overlapping)."""
    writers = [s for s in stretches if s.kind == "writer" and s.end > s.acquired]
    return [
        (w, o)
        for w in writers
        for o in stretches
        if o is not w and o.end > o.acquired and o.acquired < w.end and w.acquired < o.end
    ]


# --- a deliberately broken semaphore, for the checker's self-test ------------------------------

# KEYS[1] the semaphore's set of permits on this master. ARGV[1] token; ARGV[2] limit; ARGV[3]
# TTL in ms. Admits iff fewer than ARGV[2] unexpired permits are there. Each master alone is
# right; a majority of them is not enough (see engine/algorithm/permits.py).
NAIVE_ADMIT = """
local now = redis.call('time')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('zremrangebyscore', KEYS[1], '-inf', now_ms)
if redis.call('zcard', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('zadd', KEYS[1], now_ms + tonumber(ARGV[3]), ARGV[1])
    return 1
end
return 0
"""


class NaiveSemaphore:
    """Per-master counters capped at ``limit``, valid on a majority: NOT SAFE, on purpose."""

    def __init__(self, urls: Sequence[str], key: str, limit: int, ttl: float) -> None:
        self.clients = [
            redis.Redis.from_url(u, socket_timeout=0.02, socket_connect_timeout=0.02) for u in urls
        ]
        self.key, self.limit, self.ttl = key, limit, ttl
        self.ttl_ms = int(ttl * 1000)
        self.quorum = len(urls) // 2 + 1

    def acquire(self) -> tuple[str, float] | None:
        token, start = secrets.token_hex(16), time.monotonic()
        granted = 0
        for client in self.clients:
            for _ in range(2):  # once more on a connection the healed proxy closed
                try:
                    said = client.eval(NAIVE_ADMIT, 1, self.key, token, self.limit, self.ttl_ms)
                except redis.ConnectionError:
                    continue
                except (redis.RedisError, OSError):
                    break
                granted += int(said)  # type: ignore[arg-type]
                break
        validity = self.ttl - (time.monotonic() - start) - self.ttl * 0.01 - 0.002
        if granted >= self.quorum and validity > 0:
            return token, start + self.ttl - self.ttl * 0.01 - 0.002
        self.release(token)
        return None

    def release(self, token: str) -> None:
        for client in self.clients:
            try:
                client.zrem(self.key, token)
            except (redis.RedisError, OSError):
                pass

    def close(self) -> None:
        for client in self.clients:
            client.close()


# --- clients and faults -------------------------------------------------------------------------

#: One section: hold a permit (or a reader's or writer's lease) for a while, and say how it went.
Section = Callable[[], "Stretch | None"]


def engine_section(
    engine: Redlock, name: str, hold: float, kind: str, **options: object
) -> Section:
    """A section of the real engine: ``kind`` "permit" (``limit=`` in options), "reader"
    (``shared=True``) or "writer" (the plain lock)."""

    def section() -> Stretch | None:
        lock = engine.lock(name, **options)  # type: ignore[arg-type]
        try:
            lock.acquire()
        except LockNotAcquired:
            return None
        acquired = time.monotonic()
        valid_until = acquired + lock.validity
        time.sleep(hold)
        released = time.monotonic()
        try:
            lock.release()
        except LockLost:
            pass
        return Stretch(kind, acquired, valid_until, released)

    return section


def naive_section(semaphore: NaiveSemaphore, hold: float) -> Section:
    def section() -> Stretch | None:
        won = semaphore.acquire()
        if won is None:
            time.sleep(0.01)
            return None
        acquired = time.monotonic()
        time.sleep(hold)
        released = time.monotonic()
        semaphore.release(won[0])
        return Stretch("permit", acquired, won[1], released)

    return section


def pause_in_turn(
    masters: Sequence[LocalMaster], period: float, seed: int
) -> Callable[[threading.Event], None]:
    """A fault: every ``period`` seconds, a different minority of the masters is paused
    (SIGSTOP), the rest resumed; so that successive acquisitions each see another majority."""
    rng = random.Random(seed)  # noqa: S311 (faults, not tokens)

    def fault(stop: threading.Event) -> None:
        minority = (len(masters) - 1) // 2
        while not stop.wait(period):
            for m in masters:
                if m.paused:
                    m.resume()
            for m in rng.sample(list(masters), minority):
                m.pause()
        for m in masters:
            if m.paused:
                m.resume()

    return fault


def partition_in_turn(
    views: Sequence[Sequence[DelayProxy]], period: float, seed: int
) -> Callable[[threading.Event], None]:
    """A fault: each client reaches the masters through proxies of its own (``views``, one list
    per client); every ``period`` seconds each client loses a different random minority of them
    (its requests there are dropped, never delivered late), so that clients see different
    majorities at once: the partition the naive semaphore cannot survive."""
    rng = random.Random(seed)  # noqa: S311 (faults, not tokens)

    def fault(stop: threading.Event) -> None:
        while not stop.wait(period):
            for proxies in views:
                for proxy in proxies:
                    proxy.heal()
                for proxy in rng.sample(list(proxies), (len(proxies) - 1) // 2):
                    proxy.blackhole()
        for proxies in views:
            for proxy in proxies:
                proxy.heal()

    return fault


def partitioned_apart(views: Sequence[Sequence[DelayProxy]]) -> Callable[[threading.Event], None]:
    """A fault: for the whole run, client ``i`` cannot reach masters ``i`` and ``i+1`` (mod M):
    each client sees a different majority, at once (asymmetric reachability)."""

    def fault(stop: threading.Event) -> None:
        for i, proxies in enumerate(views):
            for j in (i, i + 1):
                proxies[j % len(proxies)].blackhole()
        stop.wait()
        for proxies in views:
            for proxy in proxies:
                proxy.heal()

    return fault


def run(
    sections: Sequence[Section], rounds: int, fault: Callable[[threading.Event], None] | None
) -> list[Stretch]:
    """Each section function in its own thread, ``rounds`` times, while ``fault`` runs."""
    recorded: list[Stretch] = []
    guard = threading.Lock()

    def client(section: Section) -> None:
        for _ in range(rounds):
            stretch = section()
            if stretch is not None:
                with guard:
                    recorded.append(stretch)

    stop = threading.Event()
    faults = threading.Thread(target=fault, args=(stop,)) if fault is not None else None
    if faults is not None:
        faults.start()
    threads = [threading.Thread(target=client, args=(s,)) for s in sections]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    stop.set()
    if faults is not None:
        faults.join(10)
    return recorded
