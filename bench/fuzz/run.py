"""One fuzz run: masters, a store, client processes, a fault controller, then the verdict.

The masters are real ``redis-server`` processes on loopback (``LocalMaster``); the counters and
the fenced store live on another one that no fault touches. Client processes are started with
``bench/fuzz/client.py``; ``engine_tree`` puts another checkout's ``django_redlock`` first
on their path (a pre-fix engine, to show the checker finds its bug).

Faults, each drawn from the run's seed (``FAULTS``):

- ``master-pause``: SIGSTOP a master for a while, then SIGCONT;
- ``master-restart``: kill a master and start it empty (the restart quarantine is on);
- ``master-delay``: the last master is behind a proxy whose delay goes over the round's budget
  and back; ``master-reset``: that proxy resets the connection after a request was applied;
- ``pause``: callers pause past their lease after reading the counter, before checking the lock;
- ``stop``: single-caller processes SIGSTOP themselves there; the controller resumes them after
  their lease ran out, or (``kill``) kills some of them instead;
- ``cpu``: two busy-looping processes beside the clients (CPU starvation);
- ``restart-majority``: lets ``master-restart`` empty more than ``N - quorum`` masters in one
  run, beyond what fencing tokens are documented to survive: the fence checker must trip.

At most two of the five masters are faulty at once (the quorum is three).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from django_redlock.testing.masters import LocalMaster, local_masters
from django_redlock.testing.proxy import DelayProxy

from . import client as client_module
from .history import Verdict, Violation, check, check_django, killed_holders, read_journals

FAULTS = (
    "master-pause",
    "master-restart",
    "master-delay",
    "master-reset",
    "pause",
    "stop",
    "kill",
    "cpu",
    "restart-majority",
)
MIXES = {
    "masters": ("master-pause", "master-restart", "master-delay", "master-reset"),
    "clients": ("pause", "stop", "kill", "cpu"),
    "all": FAULTS[:-1],
    "none": (),
}
BROKEN = ("quorum1", "setnx-one", "release-before-commit")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Options:
    seconds: float = 30.0
    seed: int = 1
    faults: tuple[str, ...] = MIXES["all"]
    processes: int = 4  # of which ``solo`` run one sync caller each
    solo: int = 2
    threads: int = 3  # sync callers in each other process
    tasks: int = 4  # async callers in each other process
    ttl: float = 2.0
    node_timeout: float = 0.05
    broken: str | None = None
    engine_tree: Path | None = None
    #: Also the Django workload (``django_client``) on a throwaway PostgreSQL: this many
    #: processes, the first ``solo`` of which run one caller each (0: none).
    django: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.faults) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
        if self.broken is not None and self.broken not in BROKEN:
            raise ValueError(f"broken={self.broken!r}; known: {', '.join(BROKEN)}")
        if not 0 <= self.solo <= max(self.processes, self.django):
            raise ValueError(f"solo={self.solo} must be between 0 and the processes")
        if self.broken == "release-before-commit" and not self.django:
            raise ValueError("broken='release-before-commit' needs the Django workload (django=N)")
        if self.engine_tree is not None and not (self.engine_tree / "django_redlock").is_dir():
            raise ValueError(f"engine_tree {self.engine_tree} has no django_redlock package")


@dataclass
class Outcome:
    verdict: Verdict
    faults_made: dict[str, int]
    stderr: str


def run(options: Options, workdir: Path | None = None) -> Outcome:
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fuzz-")))
        masters = stack.enter_context(local_masters(5, workdir / "masters"))
        started = time.monotonic()
        store_master = LocalMaster(workdir / "store").start()
        stack.callback(store_master.stop)
        proxy = None
        if {"master-delay", "master-reset"} & set(options.faults):
            proxy = stack.enter_context(DelayProxy(masters[-1].port, 0.0))
        nodes = [m.url for m in masters[:-1]] + [proxy.url if proxy else masters[-1].url]
        journal_dir = workdir / "journal"
        journal_dir.mkdir()
        prefix = f"fuzz{options.seed}:"
        database = None
        if options.django:
            from tests.postgres import throwaway_postgres

            database = stack.enter_context(throwaway_postgres())
        plan = {
            "nodes": nodes,
            "store": store_master.url,
            "journal_dir": str(journal_dir),
            "prefix": prefix,
            "seed": options.seed,
            "ttl": options.ttl,
            "node_timeout": options.node_timeout,
            "quarantine": True,
            "faults": list(options.faults),
            "solo": options.solo,
            "threads": options.threads,
            "tasks": options.tasks,
            "broken": options.broken,
            "database": database,
        }
        start_dir = workdir / "start"
        start_dir.mkdir()
        plan["start_dir"] = str(start_dir)
        plan_path = workdir / "plan.json"
        plan_path.write_text(json.dumps(plan))
        if database is not None:
            django_setup(plan_path, options)
        clients = [spawn_client(plan_path, i, options) for i in range(options.processes)]
        djangos = [spawn_client(plan_path, i, options, "django") for i in range(options.django)]
        stoppable = clients[: options.solo] + djangos[: options.solo]
        clients += djangos
        # Fresh masters are younger than MAX_TTL: under quarantine they abstain until then.
        time.sleep(max(0.0, options.ttl + 0.2 - (time.monotonic() - started)))
        stop_by = start_together(start_dir, clients, options.seconds)
        burners = stack.enter_context(cpu_burners(2 if "cpu" in options.faults else 0))
        controller = Controller(options, masters, proxy, clients, stoppable, stop_by)
        controller.start()
        try:
            stderr = wait_for_clients(clients, stop_by + options.ttl * 4 + 30)
        finally:
            controller.finish()
            for burner in burners:
                burner.kill()
        leftover = keys_left(masters, prefix, options.ttl)
        sections, others = read_journals(journal_dir)
        sections += killed_holders(others, sections)
        store = store_master.client()
        try:
            resources = sorted({r for s in sections for r in s.resources})
            counters = {r: int(store.get(client_module.counter_key(r)) or 0) for r in resources}
            accepted = {
                r: [int(t) for t in store.lrange(client_module.fence_keys(r)[1], 0, -1)]
                for r in resources
            }
        finally:
            store.close()
        verdict = check(
            sections,
            counters=counters,
            accepted=accepted,
            limits={client_module.SEMAPHORE: client_module.SEMAPHORE_LIMIT},
        )
        if database is not None:
            ledger, accounts = django_rows(database)
            django = [r for r in others if r["type"] == "django"]
            verdict.violations += check_django(django, ledger, accounts)
            verdict.by_kind.update(
                {
                    f"django-{k}": sum(r["kind"] == k for r in django)
                    for k in ("view", "with", "fenced")
                }
            )
            verdict.sections += len(django)
            leftover += keys_left(masters, "redlock:", options.ttl)
        verdict.violations += [Violation("leftover", k) for k in leftover]
        verdict.violations += [
            Violation("crash", f"{r['pid']}: {r['error']}") for r in others if r["type"] == "crash"
        ]
        return Outcome(verdict, dict(controller.made), stderr)


def start_together(
    start_dir: Path, clients: Sequence[subprocess.Popen[str]], seconds: float
) -> float:
    """Start the run once every client said it is ready (``client.started_together``), or one
    exited (its stderr tells why); returns when the run stops. Its window is then ``seconds``
    of work for every client, however long a loaded machine took to start them."""
    deadline = time.monotonic() + 120
    while len(list(start_dir.glob("*.ready"))) < len(clients) and time.monotonic() < deadline:
        if any(client.poll() is not None for client in clients):
            break
        time.sleep(0.01)
    stop_by = time.monotonic() + seconds
    told = start_dir / "go.partial"
    told.write_text(repr(stop_by))
    told.rename(start_dir / "go")  # whole or absent: a client never reads half of it
    return stop_by


def spawn_client(
    plan_path: Path, index: int | str, options: Options, kind: str = "engine"
) -> subprocess.Popen[str]:
    """Run a client script by its path (``client.py``, which imports nothing of ``bench``; or
    ``django_client.py``), with the engine's tree first on the path: this checkout's, or
    ``engine_tree``."""
    env = dict(os.environ)
    tree = options.engine_tree or REPO
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    script = (
        client_module.__file__
        if kind == "engine"
        else str(Path(__file__).with_name("django_client.py"))
    )
    return subprocess.Popen(  # noqa: S603 (our own script)
        [sys.executable, script, str(plan_path), str(index)],
        cwd=tree,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )


def django_setup(plan_path: Path, options: Options) -> None:
    """Migrate the throwaway database and make the rows, once, before any client starts."""
    setup = spawn_client(plan_path, "setup", options, "django")
    _, err = setup.communicate(timeout=120)
    if setup.returncode != 0:
        raise RuntimeError(f"the Django workload's set-up failed: {err[-3000:]}")


def django_rows(
    port: int,
) -> tuple[dict[str, tuple[int, int]], dict[str, tuple[int, int]]]:
    """The ledger rows (their value, and how many increments of them committed: their log
    rows) and the owners' accounts, as the run left them."""
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres") as db:
        rows = dict(db.execute("SELECT name, value FROM fencedapp_ledger").fetchall())
        ledger = {
            name: (value, sum(1 for other in rows if other.startswith(f"log-{name}-")))
            for name, value in rows.items()
            if not name.startswith("log-")
        }
        accounts = {
            name: (balance, fence)
            for name, balance, fence in db.execute(
                "SELECT o.name, a.balance, a.fence FROM fencedapp_ownedaccount a "
                "JOIN fencedapp_owner o ON o.id = a.owner_id"
            ).fetchall()
        }
    return ledger, accounts


def wait_for_clients(clients: Sequence[subprocess.Popen[str]], deadline: float) -> str:
    """Wait for every client to end; a client still running at the deadline is killed and its
    absence of a verdict reported as a crash."""
    errors = []
    for index, proc in enumerate(clients):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()
            errors.append(f"client {index} still running at the deadline: killed")
        err = ""
        if proc.stderr is not None:
            err = proc.stderr.read()
            proc.stderr.close()
        if proc.returncode not in (0, -signal.SIGKILL) or (err and "Traceback" in err):
            errors.append(f"client {index} exited {proc.returncode}: {err[-3000:]}")
    return "\n".join(errors)


def keys_left(masters: Sequence[LocalMaster], prefix: str, ttl: float) -> list[str]:
    """Lock keys still on a master once every lease has had its TTL to run out: none may be.
    (Fence counters stay by design: they are what makes tokens increase.)"""
    deadline = time.monotonic() + ttl + 5.0
    while True:
        found = []
        for master in masters:
            client = master.client()
            try:
                for key in client.scan_iter(match=f"{prefix}*", count=1000):
                    name = key.decode()
                    if ":fence:" in name:
                        continue
                    pttl = client.pttl(key)
                    if pttl == -1 or time.monotonic() > deadline:
                        found.append(f"{master.port} {name} pttl={pttl}")
            finally:
                client.close()
        no_expiry = [f for f in found if f.endswith("pttl=-1")]
        if no_expiry or not found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@contextlib.contextmanager
def cpu_burners(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: S603
        for _ in range(count)
    ]
    try:
        yield burners
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


class Controller(threading.Thread):
    """Makes the run's faults, drawn from its seed, until told to finish; then heals them."""

    def __init__(
        self,
        options: Options,
        masters: Sequence[LocalMaster],
        proxy: DelayProxy | None,
        clients: Sequence[subprocess.Popen[str]],
        stoppable: Sequence[subprocess.Popen[str]],
        stop_by: float,
    ) -> None:
        super().__init__(name="fuzz-faults", daemon=True)
        self.stop_by = stop_by
        self.options = options
        self.masters = masters
        self.proxy = proxy
        self.clients = clients
        self.stoppable = stoppable  # the single-caller processes, which may stop themselves
        self.rng = random.Random(f"faults/{options.seed}")
        self.done = threading.Event()
        self.made: dict[str, int] = {}
        self.faulty: dict[int, float] = {}  # master index -> when it heals
        #: Masters restarted empty so far. Fencing tokens increase while a majority of the
        #: masters keeps its counters (docs/leases.md), so at most ``N - quorum`` are, unless
        #: ``restart-majority`` asks for the documented hazard (the checker must then trip).
        self.restarted: set[int] = set()
        self.beyond = "restart-majority" in options.faults

    def run(self) -> None:
        faults = self.options.faults
        ttl = self.options.ttl
        while not self.done.wait(self.rng.uniform(0.05, 0.4)):
            self.resume_stopped_clients()
            self.heal_due()
            master_faults = [f for f in faults if f.startswith("master-")]
            if time.monotonic() > self.stop_by:
                continue  # the clients are finishing: no new fault
            if not master_faults or self.rng.random() < 0.5:
                continue
            fault = self.rng.choice(master_faults)
            free = [i for i in range(len(self.masters)) if i not in self.faulty]
            if len(self.faulty) >= 2 or not free:
                continue
            index = self.rng.choice(free)
            heal_at = time.monotonic() + self.rng.uniform(0.2, 1.5) * ttl
            if fault == "master-pause":
                self.masters[index].pause()
            elif fault == "master-restart":
                if len(self.restarted | {index}) > len(self.masters) // 2 and not self.beyond:
                    continue  # the documented envelope: a majority keeps its fence counters
                self.restarted.add(index)
                self.masters[index].restart()
                heal_at = time.monotonic()  # empty from now on; quarantine does the rest
            elif self.proxy is None or len(self.masters) - 1 in self.faulty:
                continue
            elif fault == "master-delay":
                index = len(self.masters) - 1
                self.proxy.delay = self.rng.choice((0.1, 0.3))
            else:  # master-reset
                index = len(self.masters) - 1
                self.proxy.reset_next_reply()
                heal_at = time.monotonic() + 0.2
            self.faulty[index] = heal_at
            self.made[fault] = self.made.get(fault, 0) + 1

    def heal_due(self, everything: bool = False) -> None:
        now = time.monotonic()
        for index, heal_at in list(self.faulty.items()):
            if everything or now >= heal_at:
                master = self.masters[index]
                if master.paused:
                    master.resume()
                if self.proxy is not None and index == len(self.masters) - 1:
                    self.proxy.delay = 0.0
                del self.faulty[index]

    def resume_stopped_clients(self) -> None:
        """A solo client that stopped itself holding a lock is resumed once its lease ran out
        (or killed, under ``kill``), so that the next holder's section overlaps its stale one."""
        for proc in self.stoppable:
            if proc.poll() is not None or not stopped(proc.pid):
                continue
            since = self.stopped_since.setdefault(proc.pid, time.monotonic())
            if time.monotonic() - since < self.options.ttl * 1.5:
                continue
            del self.stopped_since[proc.pid]
            if "kill" in self.options.faults and self.rng.random() < 0.3:
                proc.kill()
                self.made["kill"] = self.made.get("kill", 0) + 1
            else:
                os.kill(proc.pid, signal.SIGCONT)
                self.made["stop"] = self.made.get("stop", 0) + 1

    stopped_since: dict[int, float]

    def start(self) -> None:
        self.stopped_since = {}
        super().start()

    def finish(self) -> None:
        self.done.set()
        self.join()
        self.heal_due(everything=True)
        for proc in self.clients:
            if proc.poll() is None and stopped(proc.pid):
                os.kill(proc.pid, signal.SIGCONT)


def stopped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False
