"""One client process of the fuzzer: ``python bench/fuzz/client.py PLAN INDEX``.

It builds one engine (``django_redlock.engine.Redlock``, from whichever tree is first on the
path: ``--engine-tree`` runs an older one) and runs several callers on it at once: sync threads,
and asyncio tasks on one event loop. Each caller draws its operations from its own seeded
``random.Random``: which lock (a plain lock, several resources at once, a re-entered lock, a
writer, a reader, a permit), how long to wait, whether to extend, renew automatically, read the
fences, cancel its acquisition (``asyncio.wait_for``/``asyncio.timeout``), or pause past its lease
at the worst moment (after reading the counter, before checking that it still holds the lock).

A "solo" process runs one sync caller only and, under the ``stop`` fault, stops itself with
SIGSTOP at that worst moment (the controller resumes or kills it): with one thread, nothing else
of the process can be stopped half-way through a write.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

KINDS = ("plain", "plain", "multi", "reentrant", "writer", "reader", "reader", "permit", "permit")
NAIVE_KINDS = ("plain", "plain", "multi")  # what ``setnx-one`` locks its own way
EXCLUSIVE_RESOURCES = ("r0", "r1")
SEMAPHORE, SEMAPHORE_LIMIT = "p", 2
SHARED = "rw"

# KEYS[1] highest token accepted; KEYS[2] log of accepted tokens; ARGV[1] the writer's token.
# A max-register, as ``UPDATE ... WHERE fence < :token`` is: 1 if accepted, 0 if stale.
FENCED_WRITE = """
local token = tonumber(ARGV[1])
if token > tonumber(redis.call('get', KEYS[1]) or '0') then
    redis.call('set', KEYS[1], ARGV[1])
    redis.call('rpush', KEYS[2], ARGV[1])
    return 1
end
return 0
"""


def counter_key(resource: str) -> str:
    return f"fuzz:counter:{resource}"


def fence_keys(resource: str) -> list[str]:
    return [f"fuzz:fence:{resource}", f"fuzz:accepted:{resource}"]


class Journal:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._guard = threading.Lock()

    def write(self, record_type: str, /, **fields: Any) -> None:
        line = json.dumps({"type": record_type, **fields}) + "\n"
        with self._guard:
            self._file.write(line)
            self._file.flush()


class Client:
    def __init__(self, plan: dict[str, Any], index: int) -> None:
        from django_redlock.engine import Redlock

        self.plan = plan
        self.index = index
        self.solo = index < plan["solo"]
        nodes = list(plan["nodes"])
        broken = plan.get("broken")
        if broken == "quorum1":
            try:
                from django_redlock.engine.base import protocol
            except ImportError:  # an --engine-tree from before the engine's layers (issue 37)
                from django_redlock.engine import protocol

            protocol.quorum = lambda node_count: 1
            # Differently ordered lists, as differently configured clients would have: each
            # contender then wins "its" first master.
            shift = index % len(nodes)
            nodes = nodes[shift:] + nodes[:shift]
        ttl = plan["ttl"]
        self.engine = Redlock(
            nodes,
            key_prefix=plan["prefix"],
            ttl=ttl,
            node_timeout=plan["node_timeout"],
            retry_delay=0.02,
            max_ttl=ttl,
            quarantine=plan["quarantine"],
        )
        self.store = redis.Redis.from_url(plan["store"], socket_timeout=10)
        self.fenced_write = self.store.register_script(FENCED_WRITE)
        self.journal = Journal(Path(plan["journal_dir"]) / f"{index}.jsonl")
        self.stop_by = 0.0  # set when the run starts (``started_together``)
        self.naive = redis.Redis.from_url(plan["nodes"][0], socket_timeout=2)
        self.drawn = 0  # operations drawn by this process's callers

    # --- the operations ------------------------------------------------------------------

    def draw(self, rng: random.Random) -> dict[str, Any]:
        """One operation, drawn from the caller's own generator."""
        self.drawn += 1
        kind = rng.choice(KINDS if self.plan.get("broken") != "setnx-one" else NAIVE_KINDS)
        if kind in {"plain", "reentrant"}:
            resources = (rng.choice(EXCLUSIVE_RESOURCES),)
        elif kind == "multi":
            resources = tuple(rng.sample(EXCLUSIVE_RESOURCES, 2))  # either order
        elif kind == "permit":
            resources = (SEMAPHORE,)
        else:
            resources = (SHARED,)
        exclusive = kind not in {"reader", "permit"}
        faults = self.plan["faults"]
        return {
            "kind": kind,
            "resources": resources,
            "wait": rng.choice((0.0, 0.5, 2.0, 5.0)),
            "work": rng.uniform(0.0, 0.01),
            "extend": rng.random() < 0.2,
            "auto_extend": rng.random() < 0.15,
            "fence": exclusive and rng.random() < 0.5,
            "owned": exclusive and rng.random() < 0.2,
            "cancel": rng.random() < 0.1,
            "pause": "pause" in faults and rng.random() < 0.02,
            # (A solo process's third section always stops: a short run on a slow machine
            # still makes the fault at least once.)
            "stop": "stop" in faults and self.solo and (self.drawn == 3 or rng.random() < 0.03),
        }

    def lock(self, op: dict[str, Any], *, reentrant: bool = False) -> Any:
        kind = op["kind"]
        options: dict[str, Any] = {
            "ttl": self.plan["ttl"],
            "wait": max(0.0, min(op["wait"], self.stop_by - time.monotonic())),
            "auto_extend": op["auto_extend"],
        }
        if kind == "reader":
            options["shared"] = True
        elif kind == "permit":
            options["limit"] = SEMAPHORE_LIMIT
        elif kind == "reentrant" or reentrant:
            options["reentrant"] = True
        return self.engine.lock(*op["resources"], **options)

    def record(self, caller: str, seq: int, op: dict[str, Any], lock: Any) -> dict[str, Any]:
        acquired = time.monotonic()
        return {
            "caller": caller,
            "seq": seq,
            "kind": op["kind"],
            "resources": list(op["resources"]),
            "ttl": self.plan["ttl"],
            "acquired": acquired,
            "valid_until": acquired + lock.validity,
            "renewed": acquired,
            "auto_extend": op["auto_extend"],
            "fences": {},
            "counted": [],
        }

    def inside(self, op: dict[str, Any], lock: Any, record: dict[str, Any]) -> None:
        """The critical section, between the fences and the counter writes (no await inside:
        an async caller runs it whole, so no other task can run between check and write)."""
        exclusive = op["kind"] not in {"reader", "permit"}
        values = {}
        if exclusive:
            for resource in op["resources"]:
                values[resource] = int(self.store.get(counter_key(resource)) or 0)
        time.sleep(op["work"])
        if op["pause"]:
            # A caller paused past its lease (a GC pause, a swapped-out thread), at the worst
            # moment: after reading, before checking that it still holds the lock.
            time.sleep(self.plan["ttl"] * 1.2)
        if op["stop"]:
            self.journal.write("holding", pid=os.getpid(), **record)
            # Directed at this thread, the stop takes this thread before kill returns; sent to
            # the process (os.kill), another thread may be chosen to take it, and this one runs
            # on past the check below before the whole process stops (seen: a write 3 s late).
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        if exclusive and lock.held:
            # What the lock says now is part of the record: a renewal the caller did not see
            # itself (auto-extension) moves the end of its validity too.
            self.renewed_by_now(lock, record)
            record["checked"] = [time.monotonic(), lock.validity, values]
            for resource, value in values.items():
                self.store.set(counter_key(resource), value + 1)
                record["counted"].append(resource)
            record["wrote"] = time.monotonic()
        for resource, token in record["fences"].items():
            self.fenced_write(keys=fence_keys(resource), args=[token])

    def renewed_by_now(self, lock: Any, record: dict[str, Any]) -> None:
        now = time.monotonic()
        validity = lock.validity
        if validity > 0:
            record["valid_until"] = max(record["valid_until"], now + validity)

    def renewed(self, lock: Any, record: dict[str, Any]) -> None:
        now = time.monotonic()
        record["renewed"] = now
        record["valid_until"] = max(record["valid_until"], now + lock.validity)

    def last_seen(self, lock: Any, record: dict[str, Any]) -> None:
        """Right before the release: renewals may have moved the end of validity (as last
        known, a lower bound), and the section ends now."""
        now = time.monotonic()
        validity = lock.validity
        if validity > 0:
            record["valid_until"] = max(record["valid_until"], now + validity)
        record["released"] = time.monotonic()

    def finish(self, lock: Any, record: dict[str, Any], error: BaseException | None) -> None:
        from django_redlock.engine import LockLost

        if error is None:
            record["release"] = "ok"
        elif isinstance(error, LockLost):
            record["release"] = "unconfirmed" if getattr(error, "unconfirmed", False) else "lost"
        else:
            raise error
        self.journal.write("section", **record)

    # --- sync callers ---------------------------------------------------------------------

    def sync_caller(self, caller: str, rng: random.Random) -> None:
        from django_redlock.engine import LockNotAcquired

        seq = 0
        while time.monotonic() < self.stop_by:
            op = self.draw(rng)
            if self.plan.get("broken") == "setnx-one":
                self.naive_section(caller, seq, op)
                seq += 1
                continue
            lock = self.lock(op)
            try:
                lock.acquire()
            except LockNotAcquired:
                continue
            record = self.record(caller, seq, op, lock)
            seq += 1
            error: BaseException | None = None
            try:
                if op["kind"] == "reentrant":
                    with self.lock(op, reentrant=True):  # a second handle, the same owner
                        pass
                if op["fence"]:
                    record["fences"] = dict(lock.fences)
                if op["extend"] and not op["auto_extend"]:
                    lock.extend()
                    self.renewed(lock, record)
                if op["owned"]:
                    before = time.monotonic()
                    said = lock.owned()  # one round: does a quorum hold *our* lease?
                    record["owned"] = [before, time.monotonic(), said]
                self.inside(op, lock, record)
            except Exception as exc:  # noqa: BLE001 (a lost lease mid-section: journalled)
                record["note"] = f"{type(exc).__name__}: {exc}"[:200]
            finally:
                self.last_seen(lock, record)
                try:
                    lock.release()
                except Exception as exc:  # noqa: BLE001 (judged by ``finish``)
                    error = exc
            record.pop("note", None)
            self.finish(lock, record, error)

    def naive_section(self, caller: str, seq: int, op: dict[str, Any]) -> None:
        """The checker's self-test: ``SET NX PX`` on one master and a bare ``DEL``, the single-node
        lock Redlock replaces (no quorum, no compare on release), a key per resource taken in
        name order."""
        keys = [f"{self.plan['prefix']}naive:{r}" for r in sorted(op["resources"])]
        deadline = time.monotonic() + op["wait"]
        ttl_ms = int(self.plan["ttl"] * 1000)
        taken: list[str] = []
        for key in keys:
            while not self.naive.set(key, "x", nx=True, px=ttl_ms):
                if time.monotonic() > deadline:
                    if taken:
                        self.naive.delete(*taken)
                    return
                time.sleep(0.002)
            taken.append(key)
        acquired = time.monotonic()

        ttl = self.plan["ttl"]

        class Naive:
            held = True  # it cannot know otherwise

            @property
            def validity(self) -> float:  # what its one SET PX gave it, as it believes
                return max(0.0, acquired + ttl * 0.99 - time.monotonic())

        record = {
            "caller": caller,
            "seq": seq,
            "kind": op["kind"],
            "resources": list(op["resources"]),
            "ttl": self.plan["ttl"],
            "acquired": acquired,
            "valid_until": acquired + self.plan["ttl"] * 0.99,
            "renewed": acquired,
            "fences": {},
            "counted": [],
        }
        self.inside({**op, "fence": False}, Naive(), record)
        record["released"] = time.monotonic()
        self.naive.delete(*keys)
        record["release"] = "ok"
        self.journal.write("section", **record)

    # --- async callers --------------------------------------------------------------------

    async def async_caller(self, caller: str, rng: random.Random) -> None:
        from django_redlock.engine import LockNotAcquired

        seq = 0
        while time.monotonic() < self.stop_by:
            op = self.draw(rng)
            op["stop"] = op["pause"] = False  # a pause would stall the loop's other callers
            lock = self.lock(op)
            try:
                if op["cancel"]:
                    # Given up on from outside, at a random point of the acquisition.
                    await asyncio.wait_for(lock.aacquire(), timeout=rng.uniform(0.0, 0.02))
                else:
                    await lock.aacquire()
            except (LockNotAcquired, TimeoutError):
                continue
            record = self.record(caller, seq, op, lock)
            seq += 1
            error: BaseException | None = None
            try:
                if op["fence"]:
                    record["fences"] = dict(await lock.afences())
                if op["extend"] and not op["auto_extend"]:
                    await lock.aextend()
                    self.renewed(lock, record)
                if op["owned"]:
                    before = time.monotonic()
                    said = await lock.aowned()
                    record["owned"] = [before, time.monotonic(), said]
                self.inside(op, lock, record)
                await asyncio.sleep(0)
            except Exception as exc:  # noqa: BLE001
                record["note"] = str(exc)[:200]
            finally:
                self.last_seen(lock, record)
                try:
                    await lock.arelease()
                except Exception as exc:  # noqa: BLE001
                    error = exc
            record.pop("note", None)
            self.finish(lock, record, error)

    def run_loop(self, tasks: int, base: int) -> None:
        async def main() -> None:
            await asyncio.gather(
                *(self.async_caller(f"{self.index}/a{t}", self.rng(base + t)) for t in range(tasks))
            )

        asyncio.run(main())

    # --- the process ----------------------------------------------------------------------

    def rng(self, caller: int) -> random.Random:
        return random.Random(f"{self.plan['seed']}/{self.index}/{caller}")

    def journalled(self, caller: Callable[[], None]) -> Callable[[], None]:
        """A caller that dies of an unexpected error says so in the journal (the checker counts
        it), instead of only on a thread's stderr."""

        def run() -> None:
            try:
                caller()
            except BaseException as exc:
                self.journal.write("crash", pid=os.getpid(), error=repr(exc)[:500])
                raise

        return run

    def run(self) -> None:
        self.stop_by = started_together(self.plan, f"engine-{self.index}")
        threads_n = 1 if self.solo else self.plan["threads"]
        tasks = 0 if self.solo else self.plan["tasks"]
        callers: list[Callable[[], None]] = [
            (lambda t=t: self.sync_caller(f"{self.index}/t{t}", self.rng(t)))
            for t in range(threads_n)
        ]
        if tasks:
            callers.append(lambda: self.run_loop(tasks, threads_n))
        threads = [threading.Thread(target=self.journalled(c)) for c in callers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.engine.close()


def started_together(plan: dict[str, Any], name: str) -> float:
    """Say this client is ready (imported, connected), then wait for the run to start; returns
    when to stop (monotonic: one clock for every process of the machine). The run's clock starts
    once every client is ready: on a loaded machine a Python process may take seconds to start,
    and a window counted from spawning could end before a late client did anything."""
    start_dir = Path(plan["start_dir"])
    (start_dir / f"{name}.ready").touch()
    go = start_dir / "go"
    while not go.exists():
        time.sleep(0.01)
    return float(go.read_text())


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    Client(plan, int(sys.argv[2])).run()


if __name__ == "__main__":
    main()
