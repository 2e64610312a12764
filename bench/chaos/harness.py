"""Client processes doing critical sections on one resource, and the controller that runs them.

Each client process (``multiprocessing``, spawn: a clean interpreter with no inherited threads)
builds its own engine (``django_redlock.engine.Redlock``) over the lock masters and loops:

    acquire -> read acquired, valid-until (monotonic) -> lock.fence
      -> GET counter, sleep, [hold hook], SET counter+1 only if lock.held (never INCR)
      -> fenced write of the token (a Lua max-register: accepted iff token > highest so far)
    -> release (LockLost on leaving a lease that ran out is recorded, not raised)

The counter and the fenced store live on a separate redis-server (not a lock master), so that no
lock fault touches them. Every section is appended to a per-process JSON-lines journal, flushed
line by line, so a process killed with SIGKILL still leaves complete records (and a "holding" line
when it died holding the lock).

SIGTERM: client processes turn it into ``SystemExit`` (see ``exit_on_sigterm``), so the ``with``
block around the section runs its ``__exit__`` and releases on every master at once. Python's
default action for SIGTERM ends the process without unwinding, leaving the lock held until its TTL.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import redis

from django_redlock.engine import Lock, LockLost, LockNotAcquired, QuorumUnavailable, Redlock
from django_redlock.testing.masters import LocalMaster, local_masters
from django_redlock.testing.proxy import DelayProxy

from .checkers import Failure, Section, Verdict, check

COUNTER = "chaos:counter"
HIGHEST = "chaos:fence"  # the fenced store's highest accepted token
ACCEPTED = "chaos:accepted"  # every accepted token, in the order the store accepted them

# KEYS[1] highest accepted token; KEYS[2] log of accepted tokens; ARGV[1] the writer's token.
# Accepts the write iff the token is higher than every token accepted before (a max-register,
# like ``UPDATE ... WHERE fence < :token``). Returns 1 if accepted, 0 if rejected as stale.
FENCED_WRITE = """
local token = tonumber(ARGV[1])
if token > tonumber(redis.call('get', KEYS[1]) or '0') then
    redis.call('set', KEYS[1], ARGV[1])
    redis.call('rpush', KEYS[2], ARGV[1])
    return 1
end
return 0
"""


@dataclass(frozen=True)
class Hold:
    """Make one section hold the lock at its hold point (after reading the counter, before
    writing): ``stop`` = the process SIGSTOPs itself (the controller resumes, kills or terminates
    it), ``sleep`` = it sleeps ``seconds`` while holding."""

    process: int
    seq: int
    how: Literal["stop", "sleep"] = "stop"
    seconds: float = 0.0


@dataclass(frozen=True)
class Plan:
    """What every client process of one run does. Picklable: sent to spawned processes."""

    nodes: tuple[str, ...]
    counter_url: str
    journal_dir: str
    resource: str = "chaos"
    sections: int | None = 250  # per process; None: until ``stop_by`` (soak)
    stop_by: float = 0.0  # monotonic time at which every client gives up (set at the start)
    ttl: float = 2.0
    wait: float = 10.0
    node_timeout: float = 0.05
    retry_delay: float = 0.05
    work: float = 0.001  # seconds between reading and writing the counter
    auto_extend: bool = False
    threads: int = 1  # section threads per process, sharing one engine
    intruder: bool = False  # a thread that tries to release the other threads' lock objects
    fork_every: int = 0  # fork a child inside every n-th section (0: never)
    hold: Hold | None = None
    broken_quorum: bool = False  # the checker self-test: a quorum of 1 in the clients
    quarantine: bool = False  # restart and failover quarantine, with MAX_TTL = ``ttl``
    #: While the file ``long_flag`` exists, sections hold the lock ``long_work`` seconds instead
    #: of ``work`` (the controller makes long holds only while a fault is in force).
    long_work: float = 0.0
    long_flag: str = ""


# --- inside a client process ---


def exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    """SIGTERM -> SystemExit in the main thread: ``with`` blocks unwind and release."""
    raise SystemExit(128 + signum)


def break_quorum() -> None:
    """For the checker self-test only: every decision in this process needs one master."""
    from django_redlock.engine.base import protocol

    protocol.quorum = lambda node_count: 1


class Journal:
    """Append-only JSON lines, one write + flush per record: a killed process loses nothing it
    wrote before it died."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._guard = threading.Lock()

    def write(self, record_type: str, /, **fields: Any) -> None:
        line = json.dumps({"type": record_type, **fields}) + "\n"
        with self._guard:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        self._file.close()


class Store:
    """The counter and the fenced store, on a redis-server that is not a lock master."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url, socket_timeout=10)
        self._fenced_write = self.client.register_script(FENCED_WRITE)

    def read(self) -> int:
        return int(self.client.get(COUNTER) or 0)

    def write(self, value: int) -> None:
        self.client.set(COUNTER, value)

    def fenced_write(self, token: int) -> bool:
        return bool(self._fenced_write(keys=[HIGHEST, ACCEPTED], args=[token]))

    def close(self) -> None:
        self.client.close()


class Intruder(threading.Thread):
    """Tries to release whatever lock object another thread of this process holds right now.
    The engine must refuse every time: only the owner thread may release."""

    def __init__(self) -> None:
        super().__init__(name="intruder", daemon=True)
        self.target: Lock | None = None
        self.refused = 0
        self.released = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            lock = self.target
            if lock is not None:
                try:
                    lock.release()
                except RuntimeError:
                    self.refused += 1
                else:
                    self.released += 1
            time.sleep(0.0005)


class Client:
    """One client process: its engine, store, journal, and the section loop."""

    def __init__(self, plan: Plan, index: int, progress: Any) -> None:
        self.plan = plan
        self.index = index
        self.progress = progress
        nodes = list(plan.nodes)
        if plan.broken_quorum:
            # Each client lists the masters starting from a different one, as differently
            # configured clients would: with a quorum of 1, two contenders then each win "their"
            # first master, so the broken lock overlaps for sure, even on a busy machine where
            # the processes might otherwise happen to take turns.
            shift = index % len(nodes)
            nodes = nodes[shift:] + nodes[:shift]
        self.engine = Redlock(
            nodes,
            # Every lock passes the plan's TTL itself; the engine's default only has to pass the
            # engine's own check against its budget (replies-past-ttl gives locks a TTL shorter
            # than the budget on purpose, to show that late grants are refused).
            ttl=max(plan.ttl, 4 * plan.node_timeout),
            wait=plan.wait,
            node_timeout=plan.node_timeout,
            retry_delay=plan.retry_delay,
            max_ttl=max(plan.ttl, 4 * plan.node_timeout) if plan.quarantine else None,
            quarantine=plan.quarantine,
        )
        self.store = Store(plan.counter_url)
        self.journal = Journal(Path(plan.journal_dir) / f"{index}.jsonl")
        self.intruder = Intruder() if plan.intruder else None
        self.observers: list[redis.Redis] = []
        #: When the engine told this process (on_lost, from any thread) that a lease was lost,
        #: by ``id()`` of the lock handle (alive while it is watched).
        self.lost_at: dict[int, float] = {}

    def told_lost(self, lock: Lock, error: LockLost) -> None:
        self.lost_at[id(lock)] = time.monotonic()

    def run(self) -> None:
        plan = self.plan
        if self.intruder is not None:
            self.intruder.start()
        try:
            if plan.threads == 1:
                self.loop(str(self.index), plan.sections)
            else:
                share = None if plan.sections is None else max(1, plan.sections // plan.threads)
                threads = [
                    threading.Thread(target=self.loop, args=(f"{self.index}/{t}", share))
                    for t in range(plan.threads)
                ]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
        finally:
            if self.intruder is not None:
                self.intruder.done.set()
                self.intruder.join()
                self.journal.write(
                    "intruder", refused=self.intruder.refused, released=self.intruder.released
                )
            self.journal.close()
            self.store.close()
            for observer in self.observers:
                observer.close()
            self.engine.close()

    def loop(self, worker: str, count: int | None) -> None:
        seq = 0
        while (count is None or seq < count) and time.monotonic() < self.plan.stop_by:
            if self.section(worker, seq):
                seq += 1

    def section(self, worker: str, seq: int) -> bool:
        """One critical section; False if the lock could not be acquired (the caller retries)."""
        plan = self.plan
        wait = max(0.0, min(plan.wait, plan.stop_by - time.monotonic()))
        lock = self.engine.lock(
            plan.resource,
            ttl=plan.ttl,
            wait=wait,
            auto_extend=plan.auto_extend,
            on_lost=self.told_lost,
        )
        started = time.monotonic()
        try:
            lock.acquire()
        except LockNotAcquired as exc:
            self.journal.write(
                "failure",
                **asdict(
                    Failure(
                        worker=worker,
                        kind=type(exc).__name__,
                        started=started,
                        elapsed=time.monotonic() - started,
                        wait=wait,
                        message=str(exc)[:300],
                    )
                ),
            )
            return False
        acquired = time.monotonic()
        record: dict[str, Any] = {
            "worker": worker,
            "seq": seq,
            "acquired": acquired,
            "valid_until": acquired + lock.validity,
            "fence": None,
            "counted": False,
            "fenced": None,
            "wrote_at": None,
            "lost": False,
            "note": "",
        }
        try:
            with contextlib.ExitStack() as held:
                held.push(lock)  # released (and LockLost raised if it was lost) on leaving
                try:
                    self.critical(lock, record, worker, seq)
                finally:
                    # Renewals moved the end of validity: as last known, a lower bound (0 is
                    # no validity left, not "valid until now").
                    now = time.monotonic()
                    validity = lock.validity
                    if validity > 0:
                        record["valid_until"] = max(record["valid_until"], now + validity)
                    record["released"] = time.monotonic()
                    if self.intruder is not None:
                        self.intruder.target = None
        except LockLost:
            record["lost"] = True
        except BaseException as exc:
            record["note"] = f"{record['note']} terminated by {type(exc).__name__}".strip()
            self.journal.write("section", **record)
            raise
        self.journal.write("section", **record)
        with self.progress.get_lock():
            self.progress.value += 1
        return True

    def critical(self, lock: Lock, record: dict[str, Any], worker: str, seq: int) -> None:
        """The inside of a section: fence, non-atomic read-sleep-write, fenced write."""
        plan = self.plan
        if self.intruder is not None:
            self.intruder.target = lock
        try:
            record["fence"] = lock.fence
        except QuorumUnavailable as exc:
            record["note"] = f"no fence: {type(exc).__name__}"
            return
        value = self.store.read()
        long = plan.long_flag and os.path.exists(plan.long_flag)
        time.sleep(plan.long_work if long else plan.work)
        hold = plan.hold
        if hold is not None and (hold.process, hold.seq) == (self.index, seq):
            if worker == str(self.index) or worker.endswith("/0"):
                self.journal.write("holding", pid=os.getpid(), **record)
                if hold.how == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                else:
                    self.hold_watching(lock, hold.seconds, worker, seq)
                # What others did to the counter meanwhile (nothing, if the lock held).
                record["note"] = f"held: read {value}, counter {self.store.read()} after the hold"
        if plan.fork_every and seq % plan.fork_every == 0:
            record["note"] = self.fork_check(lock)
        if lock.held:
            self.store.write(value + 1)
            record["counted"] = True
        record["fenced"] = self.store.fenced_write(record["fence"])
        record["wrote_at"] = time.monotonic()  # after the write: an upper bound of when it landed

    def hold_watching(self, lock: Lock, seconds: float, worker: str, seq: int) -> None:
        """Hold ``seconds``, watching the lease as a careful holder would without renewing it
        (auto-extension does): journal the end of its validity as last seen, and when the
        engine told us it was lost (``on_lost``; None if it did not within the hold)."""
        began = time.monotonic()
        valid_until = began + lock.validity
        while time.monotonic() < began + seconds:
            time.sleep(0.005)
            validity = lock.validity  # does not decide "lost" itself: only the engine does
            if validity > 0:
                valid_until = max(valid_until, time.monotonic() + validity)
        told = self.lost_at.pop(id(lock), None)
        self.journal.write("told", worker=worker, seq=seq, valid_until=valid_until, lost_at=told)

    def fork_check(self, lock: Lock) -> str:
        """Fork while holding: the child must neither renew nor release the parent's lock."""
        from django_redlock.engine.running.watchdog import WATCHDOG

        before = self.masters_holding(lock)
        pid = os.fork()
        if pid == 0:  # the child: report through the exit code only, never touch shared sockets
            code = 0
            try:
                if WATCHDOG.watching:
                    code |= 1  # inherited the parent's renewal schedule
                try:
                    lock.extend()
                    code |= 2  # renewed a lock it does not own
                except RuntimeError:
                    pass
                try:
                    lock.release()  # must not reach any master
                except RuntimeError:
                    pass  # a forked child holds nothing: refused like any non-holder's
            except BaseException:  # noqa: BLE001 (anything unexpected is a failure code)
                code |= 4
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        after = self.masters_holding(lock)
        return f"fork: child exit {code}, parent's key on {before} -> {after} masters"

    def masters_holding(self, lock: Lock) -> int:
        """How many masters hold this process's value for ``lock`` (a generous timeout: this
        is an observation, not a lock round)."""
        if not self.observers:
            self.observers = [
                redis.Redis.from_url(url, socket_timeout=2) for url in self.plan.nodes
            ]
        mine = f'"pid":{os.getpid()},'.encode()
        count = 0
        for client in self.observers:
            try:
                value = client.get(lock.key)
            except (redis.RedisError, OSError):
                value = None
            count += value is not None and mine in value
        return count


def client_process(
    plan: Plan, index: int, ready: Any, go: Any, stop_by: Any, progress: Any
) -> None:
    """Entry point of one spawned client process."""
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    if plan.broken_quorum:
        break_quorum()
    client = Client(plan, index, progress)
    with ready.get_lock():
        ready.value += 1
    if go.wait(timeout=120):
        client.plan = replace(plan, stop_by=stop_by.value)
        client.run()


# --- the controller ---


class Cluster:
    """Five lock masters (some optionally behind a ``DelayProxy``) and the counter's own server.
    Use as a context manager: everything is stopped on exit."""

    #: How long after a run a request sent during it may still reach a master and take a key
    #: (which then lives its TTL). On loopback: a paused or proxied master's backlog, at once.
    late_delivery = 1.0

    def __init__(
        self,
        workdir: Path,
        *,
        masters: int = 5,
        proxied: int = 0,
        master_env: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self._count = masters
        self._proxied = proxied
        self._master_env = master_env  # e.g. the clock-step shim (django_redlock.testing.clock)
        self._stack = contextlib.ExitStack()
        self.masters: list[LocalMaster] = []
        self.proxies: list[DelayProxy] = []
        self.counter: LocalMaster | None = None

    def __enter__(self) -> Cluster:
        try:
            self.masters = self._stack.enter_context(
                local_masters(self._count, self.workdir / "masters", env=self._master_env)
            )
            (self.counter,) = self._stack.enter_context(local_masters(1, self.workdir / "counter"))
            self.proxies = [
                self._stack.enter_context(DelayProxy(m.port)) for m in self.masters[: self._proxied]
            ]
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def placed(self, index: int) -> contextlib.AbstractContextManager[None]:
        """Where client process ``index`` starts: here, on this host (``hosts.HostCluster``
        starts each on a host of its own)."""
        return contextlib.nullcontext()

    @property
    def nodes(self) -> tuple[str, ...]:
        """What clients connect to: the proxy in front of a master where there is one."""
        return tuple(p.url for p in self.proxies) + tuple(
            m.url for m in self.masters[len(self.proxies) :]
        )

    @property
    def counter_url(self) -> str:
        assert self.counter is not None
        return self.counter.url

    def each_master(self, command: Callable[[redis.Redis], object]) -> list[object]:
        """Run ``command`` on every master that is up and not paused (None for the others)."""
        out: list[object] = []
        for m in self.masters:
            if not m.alive or m.paused:
                out.append(None)
                continue
            client = m.client()
            try:
                out.append(command(client))
            except (redis.RedisError, OSError):
                out.append(None)
            finally:
                client.close()
        return out

    def lock_keys(self, pattern: str = "redlock:lock:*") -> int:
        """How many lock keys the reachable masters hold."""
        counts = self.each_master(lambda c: len(list(c.scan_iter(match=pattern, count=1000))))
        return sum(c for c in counts if isinstance(c, int))

    def lock_key_ttls(self, pattern: str = "redlock:lock:*") -> list[Any]:
        """Each reachable master's lock keys and their PTTL in ms (-1: none, which no key of
        ours may lack)."""
        return self.each_master(
            lambda c: {k.decode(): c.pttl(k) for k in c.scan_iter(match=pattern, count=1000)}
        )

    def wait_no_lock_keys(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.lock_keys() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.lock_keys() == 0

    def store_state(self) -> tuple[int, list[int]]:
        assert self.counter is not None
        client = self.counter.client()
        try:
            counter = int(client.get(COUNTER) or 0)
            accepted = [int(t) for t in client.lrange(ACCEPTED, 0, -1)]
        finally:
            client.close()
        return counter, accepted


@dataclass
class Outcome:
    """Everything one run left behind, and the checkers' verdict on it."""

    sections: list[Section]
    failures: list[Failure]
    holding: list[dict[str, Any]]  # "holding" journal lines (hold hook reached)
    told: list[dict[str, Any]]  # "told" lines: a watched hold's last validity and lost notice
    intruders: list[dict[str, Any]]
    exitcodes: list[int | None]
    counter: int
    accepted: list[int]
    verdict: Verdict
    elapsed: float
    done: int  # sections completed (released normally or with LockLost), not killed/terminated
    events: list[tuple[float, str]] = field(default_factory=list)

    def late_counts(self) -> int:
        """Counter writes by sections that found the lock held but whose validity then ran out
        before they finished (possible only under extreme scheduling delays): a lost update they
        cause is the documented pause hazard, not an engine fault."""
        return sum(
            s.counted and s.wrote_at is not None and s.wrote_at > s.valid_until
            for s in self.sections
        )


class Clients:
    """The running client processes of one run, seen from the controller."""

    def __init__(self, cluster: Cluster, plan: Plan, processes: int, budget: float) -> None:
        self.cluster = cluster
        self.plan = plan
        self.processes = processes
        self.budget = budget
        context = multiprocessing.get_context("spawn")
        self.progress = context.Value("i", 0)
        self.ready = context.Value("i", 0)
        self.go = context.Event()
        # The budget counts from the go, not from the spawn: on a loaded machine, starting Python
        # and building the engines took over 4 s once, the whole of a short soak's budget.
        self.stop_by = context.Value("d", 0.0)
        self.procs = [
            context.Process(
                target=client_process,
                args=(plan, i, self.ready, self.go, self.stop_by, self.progress),
                name=f"chaos-client-{i}",
                daemon=True,
            )
            for i in range(processes)
        ]
        self.events: list[tuple[float, str]] = []
        self.started = 0.0

    @property
    def total(self) -> int | None:
        if self.plan.sections is None:
            return None
        per = self.plan.sections
        if self.plan.threads > 1:
            per = max(1, per // self.plan.threads) * self.plan.threads
        return per * self.processes

    def start(self) -> None:
        for index, proc in enumerate(self.procs):
            with self.cluster.placed(index):
                proc.start()
        deadline = time.monotonic() + 120
        while self.ready.value < self.processes:  # every client built its engine: start together
            if time.monotonic() > deadline or any(p.exitcode is not None for p in self.procs):
                codes = [p.exitcode for p in self.procs]
                for proc in self.procs:
                    proc.kill()
                    proc.join(5)
                raise RuntimeError(f"client processes did not start (exit codes {codes})")
            time.sleep(0.01)
        self.started = time.monotonic()
        self.stop_by.value = self.started + self.budget
        self.plan = replace(self.plan, stop_by=self.stop_by.value)
        self.go.set()

    def done(self) -> int:
        return int(self.progress.value)

    def note(self, event: str) -> float:
        now = time.monotonic()
        self.events.append((now, event))
        return now

    def wait_progress(self, fraction: float, timeout: float = 120.0) -> bool:
        """Wait until ``fraction`` of all sections are done (or every client exited)."""
        total = self.total
        return self.wait_done(1 if total is None else max(1, int(total * fraction)), timeout)

    def wait_done(self, sections: int, timeout: float = 120.0) -> bool:
        """Wait until ``sections`` sections are done in all (or every client exited)."""
        deadline = time.monotonic() + timeout
        while self.done() < sections and time.monotonic() < deadline:
            if not any(p.is_alive() for p in self.procs):
                return False
            time.sleep(0.005)
        return self.done() >= sections

    def wait_holding(self, process: int, timeout: float = 60.0) -> dict[str, Any]:
        """Wait for a client to reach its hold point; its "holding" record. For a ``stop`` hold,
        also wait until the kernel shows the process stopped."""
        path = Path(self.plan.journal_dir) / f"{process}.jsonl"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in read_journal(path):
                if record["type"] == "holding":
                    hold = self.plan.hold
                    if hold is not None and hold.how == "stop":
                        while not stopped(record["pid"]) and time.monotonic() < deadline:
                            time.sleep(0.002)
                    return dict(record)
            time.sleep(0.005)
        raise TimeoutError(f"client {process} did not reach its hold point in {timeout}s")

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.1, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():  # a client that overran the run's deadline: stop it, say so
                self.note(f"client {proc.name} still running at the deadline: killed")
                if proc.pid is not None:
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.join(5)

    def outcome(self) -> Outcome:
        sections: list[Section] = []
        failures: list[Failure] = []
        holding: list[dict[str, Any]] = []
        told: list[dict[str, Any]] = []
        intruders: list[dict[str, Any]] = []
        for path in sorted(Path(self.plan.journal_dir).glob("*.jsonl")):
            for record in read_journal(path):
                kind = record.pop("type")
                if kind == "section":
                    sections.append(Section(**record))
                elif kind == "failure":
                    failures.append(Failure(**record))
                elif kind == "holding":
                    holding.append(record)
                elif kind == "intruder":
                    intruders.append(record)
                elif kind == "told":
                    told.append(record)
        finished = {(s.worker, s.seq) for s in sections}
        for record in holding:
            if (record["worker"], record["seq"]) not in finished:
                # Died holding the lock (SIGKILL): it held it, unreleased, until its lease ran
                # out; nobody else may have held it within that validity.
                fields = {k: record[k] for k in Section.__dataclass_fields__ if k in record}
                fields.update(released=float("inf"), note="killed while holding")
                sections.append(Section(**fields))
        counter, accepted = self.cluster.store_state()
        return Outcome(
            sections=sections,
            failures=failures,
            holding=holding,
            told=told,
            intruders=intruders,
            exitcodes=[p.exitcode for p in self.procs],
            counter=counter,
            accepted=accepted,
            verdict=check(sections, counter, accepted),
            elapsed=time.monotonic() - self.started,
            done=self.done(),
            events=self.events,
        )


def read_journal(path: Path) -> list[dict[str, Any]]:
    """The complete records of a journal; a line still being written (no newline yet) is left
    for the next read."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").split("\n")
    return [json.loads(line) for line in lines[:-1] if line]


def stopped(pid: int) -> bool:
    """True if the kernel shows ``pid`` stopped (SIGSTOP): state T in /proc/<pid>/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


Faults = Callable[[Clients], None]


def run(
    cluster: Cluster,
    plan: Plan,
    processes: int,
    faults: Faults | None = None,
    *,
    budget: float = 300.0,
) -> Outcome:
    """Start ``processes`` clients with ``plan``, let ``faults`` act on them and the cluster while
    they work, wait for them (at most ``budget`` seconds in all), and check what they recorded."""
    Path(plan.journal_dir).mkdir(parents=True, exist_ok=True)
    clients = Clients(cluster, plan, processes, budget)
    clients.start()
    try:
        if faults is not None:
            faults(clients)
    finally:
        clients.join(max(1.0, clients.plan.stop_by - time.monotonic() + 5.0))
    return clients.outcome()
