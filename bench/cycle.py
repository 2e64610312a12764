"""The acquire+release cycle benchmarks (issue 6, scenarios a, b and d).

``uncontended()`` (a): one uncontended acquire+release cycle on one resource, 5 real local
masters, for the raw floor of the protocol, our engine (sync and async) and the peer libraries,
interleaved in rounds so that machine noise hits all of them alike. ``proxied()`` (b): the same
with every master behind a loopback proxy that adds a network hop.

``faults()`` (d): the same cycle with one master killed, then with one master paused (SIGSTOP),
against the floor with a time budget and our engine; peers with a bounded socket timeout and few
cycles.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import secrets
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import redis
from redis._parsers.encoders import Encoder
from redis.asyncio.connection import Connection as AsyncConnection
from redis.connection import Connection

from django_redlock.engine import Redlock
from django_redlock.engine.scripts.plain import Script
from django_redlock.testing.masters import LocalMaster, local_masters

from . import report
from .django_layer import OursDjango, OursDjangoAsync
from .peers import (
    Address,
    Batch,
    Contender,
    CycleFailed,
    PotteryRedlock,
    PythonRedisLock,
    RedisPyLock,
    RedlockPy,
    timed,
)
from .proxies import delayed
from .remote import RemoteContender

MASTERS = 5
TTL = 10.0
NODE_TIMEOUT = 0.05  # our engine's default per-node budget; the floor's budget under faults

# The floor's own compare-and-delete, the minimum a safe release needs. Not the engine's RELEASE,
# which may do more (and whose extra cost then rightly shows in our rows).
FLOOR_RELEASE = Script(
    "floor_release",
    """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
""",
)


#: One Redis command, name first, as redis-py packs it.
Command = tuple[bytes | str | int | float, ...]

# The floors pack each round's command once and send the same bytes to every master, as the
# engine does; with hiredis' packer when installed (redis.asyncio's own packer is pure Python).
_PACKER: Any = (
    redis.connection.HiredisRespSerializer()
    if redis.utils.HIREDIS_AVAILABLE
    else redis.connection.PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
)


def pack(command: Command) -> list[bytes]:
    return _PACKER.pack(*command)  # type: ignore[no-any-return]


def addresses(masters: Sequence[LocalMaster]) -> list[Address]:
    return [("127.0.0.1", m.port) for m in masters]


# --- the floor ---------------------------------------------------------------------------------


class Floor:
    """The 2-round-trip protocol with nothing around it: redis-py connections used directly,
    ``SET NX PX`` written to every master before any reply is read, then the compare-and-delete
    script (EVALSHA) the same way. No quorum logic, no pool, no retry; every master must say OK.
    """

    name = "floor"
    meaning = (
        "raw protocol: SET NX PX packed once, written to all 5 connections, then all replies "
        "read; then EVALSHA compare-and-delete the same way; redis-py defaults, no quorum logic"
    )

    def __init__(self, addresses: Sequence[Address], resource: str) -> None:
        self._conns = [Connection(host=host, port=port) for host, port in addresses]
        for conn in self._conns:
            conn.connect()
        self._key = resource
        self._ttl_ms = int(TTL * 1000)

    def _cycle(self) -> None:
        token = secrets.token_hex(16)
        conns = self._conns
        packed = pack(("SET", self._key, token, "NX", "PX", self._ttl_ms))
        for conn in conns:
            conn.send_packed_command(packed, check_health=False)
        granted = [conn.read_response() for conn in conns]
        packed = pack(("EVALSHA", FLOOR_RELEASE.sha, 1, self._key, token))
        for conn in conns:
            conn.send_packed_command(packed, check_health=False)
        released = [conn.read_response() for conn in conns]
        if not (all(granted) and all(released)):  # a benchmark sanity check, not quorum logic
            raise CycleFailed(f"SET replies {granted}, release replies {released}")

    def run(self, cycles: int) -> Batch:
        return timed(self._cycle, cycles)

    def close(self) -> None:
        for conn in self._conns:
            conn.disconnect()


class AsyncFloor:
    """``Floor`` on ``redis.asyncio`` connections inside one event loop: what asyncio itself
    costs, so that our async row can be read against the right floor."""

    name = "floor (asyncio)"
    meaning = (
        "the floor on redis.asyncio connections with no socket timeout (commands packed by "
        "hiredis, once per round), all cycles inside one long-lived event loop"
    )

    def __init__(self, addresses: Sequence[Address], resource: str) -> None:
        self._runner = asyncio.Runner()
        # socket_timeout=None: redis.asyncio's default (5 s) wraps every send in wait_for, which
        # on Python 3.11 costs a Task per send; the floor is what asyncio itself needs.
        self._conns = [
            AsyncConnection(host=host, port=port, socket_timeout=None) for host, port in addresses
        ]
        for conn in self._conns:
            self._runner.run(conn.connect())
        self._key = resource
        self._ttl_ms = int(TTL * 1000)

    async def _round(self, command: Command) -> list[object]:
        packed = pack(command)
        for conn in self._conns:
            await conn.send_packed_command(packed, check_health=False)
        return [await conn.read_response() for conn in self._conns]

    async def _batch(self, cycles: int) -> Batch:
        batch = Batch()
        clock = time.perf_counter_ns
        for _ in range(cycles):
            start = clock()
            token = secrets.token_hex(16)
            granted = await self._round(("SET", self._key, token, "NX", "PX", self._ttl_ms))
            released = await self._round(("EVALSHA", FLOOR_RELEASE.sha, 1, self._key, token))
            if not (all(granted) and all(released)):
                batch.errors.append(f"SET replies {granted}, release replies {released}")
                continue
            batch.times_ns.append(clock() - start)
        return batch

    def run(self, cycles: int) -> Batch:
        return self._runner.run(self._batch(cycles))

    def close(self) -> None:
        for conn in self._conns:
            self._runner.run(conn.disconnect())
        self._runner.close()


class BoundedFloor:
    """The floor that survives a faulty master: each round waits for replies only until one
    common deadline ``timeout`` away (as our engine does); a master that misses it loses its
    connection (a late reply must never be read as a later answer). A master without a connection
    gets one connect attempt per cycle, in the SET round; the release round also goes to every
    master the SET was sent to, since a late SET may still land."""

    name = "floor, bounded"
    meaning = (
        "the floor plus a 50 ms common deadline per round; a master without a connection gets "
        "one connect attempt per cycle (SET round only); no quorum logic"
    )

    def __init__(
        self, addresses: Sequence[Address], resource: str, timeout: float = NODE_TIMEOUT
    ) -> None:
        self._addresses = list(addresses)
        self._timeout = timeout
        self._conns: list[Connection | None] = [None] * len(self._addresses)
        self._key = resource
        self._ttl_ms = int(TTL * 1000)

    def _connect(self, i: int, deadline: float) -> Connection | None:
        host, port = self._addresses[i]
        budget = max(deadline - time.monotonic(), 0.0001)
        conn = Connection(
            host=host,
            port=port,
            socket_timeout=budget,
            socket_connect_timeout=budget,
            driver_info=None,  # no CLIENT SETINFO: connecting costs one TCP handshake only
            protocol=2,
        )
        try:
            conn.connect()
        except (redis.RedisError, OSError):
            return None
        conn.socket_timeout = self._timeout
        self._conns[i] = conn
        return conn

    def _round(self, targets: list[int], command: Command, reconnect: bool) -> int:
        """Send ``command`` to each target master, then read replies by one deadline. Returns
        how many said yes; ``targets`` is updated in place to the masters it was sent to."""
        deadline = time.monotonic() + self._timeout
        packed = pack(command)
        sent = []
        for i in targets:
            conn = self._conns[i]
            if conn is None and reconnect:
                conn = self._connect(i, deadline)
            if conn is None:
                continue
            try:
                conn.send_packed_command(packed, check_health=False)
            except (redis.RedisError, OSError):
                self._drop(i)
                continue
            sent.append(i)
        yes = 0
        for i in sent:
            conn = self._conns[i]
            assert conn is not None
            try:
                yes += bool(conn.read_response(timeout=max(deadline - time.monotonic(), 0.0001)))
            except redis.ResponseError:
                pass
            except (redis.RedisError, OSError):
                self._drop(i)
        targets[:] = sent
        return yes

    def _drop(self, i: int) -> None:
        conn, self._conns[i] = self._conns[i], None
        if conn is not None:
            conn.disconnect()

    def _cycle(self) -> None:
        token = secrets.token_hex(16)
        targets = list(range(len(self._addresses)))
        granted = self._round(targets, ("SET", self._key, token, "NX", "PX", self._ttl_ms), True)
        # Release wherever the SET went, reconnecting where its reply was late: it may land.
        self._round(targets, ("EVALSHA", FLOOR_RELEASE.sha, 1, self._key, token), True)
        if granted < len(self._addresses) // 2 + 1:  # a benchmark sanity check
            raise CycleFailed(f"only {granted} masters granted the SET")

    def run(self, cycles: int) -> Batch:
        return timed(self._cycle, cycles)

    def close(self) -> None:
        for i in range(len(self._conns)):
            self._drop(i)


# --- our engine --------------------------------------------------------------------------------


class Ours:
    name = "ours (sync)"
    meaning = (
        "django_redlock Redlock(5 urls).lock(r, ttl=10): acquire()+release(), same Lock object"
    )

    def __init__(self, urls: Sequence[str], resource: str) -> None:
        self.redlock = Redlock(list(urls), node_timeout=NODE_TIMEOUT)
        self._lock = self.redlock.lock(resource, ttl=TTL)

    def _cycle(self) -> None:
        self._lock.acquire()
        self._lock.release()

    def run(self, cycles: int) -> Batch:
        return timed(self._cycle, cycles)

    def close(self) -> None:
        self.redlock.close()


class OursWith(Ours):
    """How Django code uses it: ``with redlock(r):`` makes a new ``Lock`` every time."""

    name = "ours (sync, with)"
    meaning = "the same engine as `with redlock.lock(r, ttl=10):`, a new Lock object every cycle"

    def __init__(self, urls: Sequence[str], resource: str) -> None:
        super().__init__(urls, resource)
        self._resource = resource

    def _cycle(self) -> None:
        with self.redlock.lock(self._resource, ttl=TTL):
            pass


class OursAsync:
    name = "ours (async)"
    meaning = "the same, await aacquire()+arelease(), all cycles inside one long-lived event loop"

    def __init__(self, urls: Sequence[str], resource: str) -> None:
        self.redlock = Redlock(list(urls), node_timeout=NODE_TIMEOUT)
        self._lock = self.redlock.lock(resource, ttl=TTL)
        # One loop for the whole run: the engine pools async connections per event loop.
        self._runner = asyncio.Runner()

    async def _batch(self, cycles: int) -> Batch:
        batch = Batch()
        clock = time.perf_counter_ns
        lock = self._lock
        for _ in range(cycles):
            start = clock()
            try:
                await lock.aacquire()
                await lock.arelease()
            except Exception as exc:  # noqa: BLE001 (a failed cycle is a result to report)
                batch.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            batch.times_ns.append(clock() - start)
        return batch

    def run(self, cycles: int) -> Batch:
        return self._runner.run(self._batch(cycles))

    def close(self) -> None:
        self._runner.close()
        self.redlock.close()


# --- running -----------------------------------------------------------------------------------


def measure(
    contenders: Sequence[Contender], *, rounds: int, cycles: int, warmup: int
) -> dict[str, Batch]:
    """Warm each contender up, then run ``rounds`` rounds of ``cycles`` cycles each, rotating
    the order every round so that no one always runs first, last, or next to the same one."""
    for contender in contenders:
        contender.run(warmup)
    results = {c.name: Batch() for c in contenders}
    for r in range(rounds):
        shift = r % len(contenders)
        for contender in [*contenders[shift:], *contenders[:shift]]:
            gc.collect()  # nobody pays for the previous contender's garbage
            results[contender.name].add(contender.run(cycles))
    return results


@contextlib.contextmanager
def closing_all(contenders: Sequence[Contender]) -> Iterator[Sequence[Contender]]:
    try:
        yield contenders
    finally:
        for contender in contenders:
            contender.close()


def load_scripts(masters: Sequence[LocalMaster]) -> None:
    """The floor sends EVALSHA only: its masters must know the script beforehand."""
    for master in masters:
        client = master.client()
        try:
            client.script_load(FLOOR_RELEASE.source)
        finally:
            client.close()


def leftovers(masters: Sequence[LocalMaster]) -> dict[str, int]:
    """Keys still on the reachable masters, each with how many masters hold it. After a run of
    acquire+release cycles there should be none: a key left is a lock that some implementation
    believes released but that still blocks others on that master until its TTL."""
    held: dict[str, int] = {}
    for master in masters:
        if not master.alive or master.paused:
            continue
        client = master.client()
        try:
            for key in client.scan_iter(count=1000):
                name = key.decode(errors="replace")
                held[name] = held.get(name, 0) + 1
        finally:
            client.close()
    return held


def describe_leftovers(held: dict[str, int], when: str) -> str:
    if not held:
        return f"Keys left on the masters {when}: none."
    keys = ", ".join(f"`{key}` on {count}" for key, count in sorted(held.items()))
    signal = any(key.startswith("lock-signal:") for key in held)
    return (
        f"Keys left on the masters {when}: {keys}. A lock key left blocks its master for the "
        f"rest of its TTL."
        + (
            " (`lock-signal:*` is python-redis-lock's 1 s wake-up list, not a lock.)"
            if signal
            else ""
        )
    )


# --- redlock-ng (in its own virtual environment) ------------------------------------------------


def redlock_ng(urls: Sequence[str], resource: str, timeout: float | None = None) -> list[Contender]:
    """redlock-ng's rows: its sync and async client, each in a worker process of its own
    environment (see ``remote.py``); ``timeout``: its socket budget (default 0.1 s)."""
    config = {"urls": list(urls), "key": resource, "ttl": TTL, "timeout": timeout}
    return [
        RemoteContender(
            "redlock-ng",
            "redlock-ng Redlock (sync) over the 5 masters, retry_count=0: acquire()+release(); "
            "asks the masters one after the other (worker process, own venv)",
            "redlock-ng",
            config,
        ),
        RemoteContender(
            "redlock-ng (async)",
            "redlock-ng AsyncRedlock, retry_count=0: all masters at once (asyncio.gather), "
            "inside one event loop (worker process, own venv)",
            "redlock-ng-async",
            {**config, "key": f"{resource}-async"},
        ),
    ]


# --- scenarios (a) and (b): uncontended cycle, on loopback and one hop away ---------------------


def uncontended(
    *, rounds: int = 30, cycles: int = 100, warmup: int = 100
) -> tuple[str, dict[str, Any]]:
    """Scenario (a): the uncontended cycle on 5 healthy local masters, every implementation."""
    with local_masters(MASTERS) as masters:
        load_scripts(masters)
        return _cycle_scenario(
            "a",
            "## (a) Uncontended acquire+release, 5 local masters",
            masters,
            addresses(masters),
            rounds=rounds,
            cycles=cycles,
            warmup=warmup,
            unit="us",
            note="",
        )


def proxied(
    *, delay: float = 0.001, rounds: int = 10, cycles: int = 20, warmup: int = 10
) -> tuple[str, dict[str, Any]]:
    """Scenario (b): the same with every master behind a loopback proxy adding ``delay`` seconds
    each way (a network hop); the proxies run in a process of their own."""
    with local_masters(MASTERS) as masters:
        load_scripts(masters)
        with delayed([m.port for m in masters], delay) as ports:
            addrs = [("127.0.0.1", port) for port in ports]
            rtt = ping_rtt_ms(addrs[0])
            return _cycle_scenario(
                "b",
                f"## (b) Uncontended acquire+release, every master behind a proxy adding "
                f"{delay * 1000:g} ms each way",
                masters,
                addrs,
                rounds=rounds,
                cycles=cycles,
                warmup=warmup,
                unit="ms",
                note=f"Round trip through one proxy (PING, median of 50): {rtt:.2f} ms; the "
                "protocol needs 2 round trips per cycle. ",
            )


def ping_rtt_ms(address: Address) -> float:
    client = redis.Redis(host=address[0], port=address[1])
    try:
        client.ping()
        times = []
        for _ in range(50):
            start = time.perf_counter_ns()
            client.ping()
            times.append(time.perf_counter_ns() - start)
    finally:
        client.close()
    return statistics.median(times) / 1e6


def _cycle_scenario(
    scenario: str,
    title: str,
    masters: Sequence[LocalMaster],
    addrs: Sequence[Address],
    *,
    rounds: int,
    cycles: int,
    warmup: int,
    unit: str,
    note: str,
) -> tuple[str, dict[str, Any]]:
    urls = [f"redis://{host}:{port}/0" for host, port in addrs]
    contenders: list[Contender] = [
        Floor(addrs, "bench:floor"),
        Ours(urls, "bench:ours-sync"),
        OursWith(urls, "bench:ours-with"),
        AsyncFloor(addrs, "bench:floor-async"),
        OursAsync(urls, "bench:ours-async"),
        OursDjango(urls, "bench:ours-django"),
        OursDjangoAsync(urls, "bench:ours-django-async"),
        PotteryRedlock(addrs, "bench:pottery"),
        RedlockPy(addrs, "bench:redlock-py"),
        *redlock_ng(urls, "bench:redlock-ng"),
        RedisPyLock(addrs[0], "bench:redis-py"),
        PythonRedisLock(addrs[0], "bench:python-redis-lock"),
    ]
    started = time.monotonic()
    with closing_all(contenders):
        results = measure(contenders, rounds=rounds, cycles=cycles, warmup=warmup)
    took = time.monotonic() - started
    left = describe_leftovers(leftovers(masters), "after the run")

    scale = 1.0 if unit == "us" else 1000.0
    digits = 1 if unit == "us" else 2
    summaries = {name: report.summarize(b.times_ns, b.errors) for name, b in results.items()}
    floor = summaries[Floor.name]
    data: dict[str, Any] = {
        "scenario": scenario,
        "environment": report.environment(),
        "unit": unit,
        "floor": Floor.name,
        "rows": {},
    }
    rows = []
    for contender in contenders:
        s = summaries[contender.name]
        data["rows"][contender.name] = {
            "median": s.median_us / scale,
            "p99": s.p99_us / scale,
            "cycles": s.cycles,
            "errors": s.errors,
            "first_error": s.first_error,
        }
        rows.append(
            [
                contender.name,
                report.with_ratio(s.median_us / scale, floor.median_us / scale, digits),
                report.with_ratio(s.p99_us / scale, floor.p99_us / scale, digits),
                f"{s.cycles}" + (f" ({s.errors} failed: {s.first_error})" if s.errors else ""),
                contender.meaning,
            ]
        )
    headers = [
        "implementation",
        f"median {unit} (x floor)",
        f"p99 {unit} (x floor's p99)",
        "cycles",
        "what it is",
    ]
    text = "\n".join(
        [
            title,
            "",
            f"{data['environment']}. {note}{rounds} rounds x {cycles} cycles per implementation, "
            f"order rotated each round, {warmup} warm-up cycles each; took {took:.1f} s.",
            "",
            report.table(headers, rows),
            "",
            left,
        ]
    )
    return text, data


# --- scenario (d): a dead master, a paused master ----------------------------------------------


def faults(
    *, cycles: int = 100, paused_cycles: int = 10, peer_cycles: int = 5
) -> tuple[str, dict[str, Any]]:
    """Markdown: the cycle with 1 of 5 masters killed, then 1 of 5 paused (SIGSTOP). Each fault
    gets 5 fresh masters; every implementation is first measured healthy on them."""
    started = time.monotonic()
    rows: list[list[str]] = []
    legend: dict[str, str] = {}
    notes: list[str] = []
    data: dict[str, Any] = {
        "scenario": "d",
        "environment": report.environment(),
        "node_timeout_ms": NODE_TIMEOUT * 1000,
        "faults": {},
    }
    with _quiet_peers():
        for fault, inject, rounds, fault_cycles, fault_peer_cycles in [
            ("1 of 5 killed", LocalMaster.kill, 5, cycles, peer_cycles * 4),
            ("1 of 5 paused", LocalMaster.pause, 2, paused_cycles, peer_cycles),
        ]:
            fault_rows, data["faults"][fault] = _fault_rows(
                fault,
                inject,
                legend,
                notes,
                rounds=rounds,
                cycles=fault_cycles,
                peer_cycles=fault_peer_cycles,
            )
            rows += fault_rows
    headers = ["fault", "implementation", "median ms (x floor)", "p99 ms (x floor's p99)"]
    headers += ["healthy median ms", "extra / NODE_TIMEOUT", "median / bound", "cycles"]
    return "\n".join(
        [
            "## (d) One of 5 masters down",
            "",
            f"{data['environment']}. NODE_TIMEOUT = {NODE_TIMEOUT * 1000:.0f} ms. Ratios are to "
            "'floor, bounded' under the same fault. 'healthy median' is the same implementation "
            "on the same 5 masters just before the fault; 'extra / NODE_TIMEOUT' = (median - "
            "healthy median) / NODE_TIMEOUT, how many per-node budgets the fault costs per cycle "
            "(a cycle is 2 rounds, acquire and release: a master that never answers costs a "
            "round-by-round implementation about 2). bound = the bounded floor's healthy median "
            "+ NODE_TIMEOUT (the target: at most 1.00).",
            "",
            report.table(headers, rows),
            "",
            "Rows:",
            "",
            *(f"- **{name}**: {meaning}" for name, meaning in legend.items()),
            "",
            "Peers here get a socket budget of NODE_TIMEOUT and no retries (our engine's "
            "settings): with redis-py's defaults (no socket timeout, retries) a paused master "
            "holds them for as long as it is paused. Failed cycles are not in the timings; the "
            "cycles column counts them with the first error. Single-node locks are left out: "
            "they use either a healthy master (unchanged) or the faulty one (fail).",
            "",
            *(f"{note}\n" for note in notes),
            f"Took {time.monotonic() - started:.1f} s.",
        ]
    ), data


def _fault_rows(
    fault: str,
    inject: Callable[[LocalMaster], None],
    legend: dict[str, str],
    notes: list[str],
    *,
    rounds: int,
    cycles: int,
    peer_cycles: int,
) -> tuple[list[list[str]], dict[str, Any]]:
    with local_masters(MASTERS) as masters:
        load_scripts(masters)
        addrs = addresses(masters)
        urls = [m.url for m in masters]
        ours: list[Contender] = [
            BoundedFloor(addrs, "bench:floor"),
            Ours(urls, "bench:ours-sync"),
            OursAsync(urls, "bench:ours-async"),
        ]
        peers: list[Contender] = [
            PotteryRedlock(addrs, "bench:pottery", timeout=NODE_TIMEOUT),
            RedlockPy(
                addrs, "bench:redlock-py", timeout=NODE_TIMEOUT, fresh_resource_each_cycle=True
            ),
            *redlock_ng(urls, "bench:redlock-ng", timeout=NODE_TIMEOUT),
        ]
        with closing_all([*ours, *peers]):
            before = measure(ours, rounds=3, cycles=100, warmup=50)
            before |= measure(peers, rounds=3, cycles=50, warmup=20)
            notes.append(
                describe_leftovers(leftovers(masters), f"before the fault '{fault}' was injected")
            )
            inject(masters[0])
            after = measure(ours, rounds=rounds, cycles=cycles, warmup=0)
            after |= measure(peers, rounds=1, cycles=peer_cycles, warmup=0)
    floor = report.summarize(after[BoundedFloor.name].times_ns, [])
    floor_healthy_ms = report.summarize(before[BoundedFloor.name].times_ns, []).median_us / 1000
    bound_ms = floor_healthy_ms + NODE_TIMEOUT * 1000
    rows = []
    data: dict[str, Any] = {"bound_ms": bound_ms, "rows": {}}
    for contender in [*ours, *peers]:
        legend[contender.name] = contender.meaning
        healthy_ms = report.summarize(before[contender.name].times_ns, []).median_us / 1000
        batch = after[contender.name]
        s = report.summarize(batch.times_ns, batch.errors)
        median_ms = s.median_us / 1000
        extra = median_ms - healthy_ms
        failed = f" ({s.errors} failed: {s.first_error})" if s.errors else ""
        data["rows"][contender.name] = {
            "median_ms": median_ms,
            "p99_ms": s.p99_us / 1000,
            "healthy_median_ms": healthy_ms,
            "cycles": s.cycles,
            "errors": s.errors,
            "first_error": s.first_error,
        }
        rows.append(
            [
                fault,
                contender.name,
                report.with_ratio(median_ms, floor.median_us / 1000, 3),
                report.with_ratio(s.p99_us / 1000, floor.p99_us / 1000, 3),
                report.number(healthy_ms, 3),
                report.number(extra / (NODE_TIMEOUT * 1000), 2),
                report.number(median_ms / bound_ms, 2),
                f"{s.cycles}{failed}",
            ]
        )
    return rows, data


@contextlib.contextmanager
def _quiet_peers() -> Iterator[None]:
    """Peers log a traceback for every failed master call (pottery to its logger, redlock-py to
    the root logger); hundreds of them would bury the table. Their failures still show in the
    table through what their calls return or raise."""
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)
