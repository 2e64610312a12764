"""A client process of the fuzzer's Django workload, on PostgreSQL:
``python bench/fuzz/django_client.py PLAN INDEX`` (or ``PLAN setup``, once, before the others).

Its callers (threads) draw from their seeded generators, on a few rows of ``tests.fencedapp``:

- ``view``: a POST to a ``lock_view`` under ``ATOMIC_REQUESTS`` that reads a ledger row, works
  and saves it +1 (never an ``F()``: it could not lose an update). Counted when it answered 200;
- ``with``: the same read, work, save inside ``with redlock()`` inside the caller's
  ``transaction.atomic()``. Counted when the transaction committed (``CommitRefused`` is not);
- ``fenced``: inside ``with redlock()``, ``OwnedAccount.objects.filter(owner__name=...)
  .update(balance=F("balance") + 1, fence=lock)``, a fenced update through a join. Accepted when
  it wrote the row.

A solo process stops itself (SIGSTOP on its own thread) at each operation's worst moment, when
the plan's faults include ``stop``: after the lock's block ended and before the transaction's
COMMIT (``view``, ``with``), or between reading the token and the fenced update (``fenced``).
With ``broken="release-before-commit"`` every lock is released at its block's end, before the
COMMIT: the lost-update checker must then trip.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

PLAN = json.loads(Path(sys.argv[1]).read_text()) if __name__ == "__main__" else {}
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
if PLAN:
    os.environ["REDLOCK_TEST_PG"] = str(PLAN["database"])  # read by tests.settings

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.ROOT_URLCONF = __name__
if PLAN:  # the fuzzer's masters, under quarantine as its engine clients are
    settings.REDLOCK = {
        "NODES": PLAN["nodes"],
        "TTL": float(PLAN["ttl"]),
        "MAX_TTL": float(PLAN["ttl"]),
        "QUARANTINE": True,
        "NODE_TIMEOUT": PLAN["node_timeout"],
        "RETRY_DELAY": 0.02,
    }
django.setup()

from django.db import connections, transaction  # noqa: E402
from django.db.models import F  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import path  # noqa: E402

from django_redlock import lock_view, redlock  # noqa: E402
from tests.fencedapp.models import Ledger, OwnedAccount, Owner  # noqa: E402

ROWS = ("a", "b")
OWNERS = ("o1", "o2")
TTL = float(PLAN.get("ttl", 2.0))
EARLY = PLAN.get("broken") == "release-before-commit"
SOLO = __name__ == "__main__" and sys.argv[2] != "setup" and int(sys.argv[2]) < PLAN["solo"]
STOPS = SOLO and "stop" in PLAN.get("faults", ())
local = threading.local()


def worst_moment(journal: Any, record: dict[str, Any]) -> None:
    """Stop here (a solo process under ``stop``), as a pause would; the controller resumes."""
    if STOPS and local.rng.random() < 0.05:
        journal.write("django-holding", pid=os.getpid(), **record)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def read_work_save(name: str) -> None:
    """Read the row, work, save it +1; and, in the same transaction, a log row naming this
    operation: what committed is then known exactly from the database, whatever the caller was
    told (a ``LockLost`` raised after a commit that happened, a 500 after it)."""
    row = Ledger.objects.get(name=name)
    time.sleep(local.rng.uniform(0.0, 0.01))
    row.value += 1
    row.save(update_fields=["value"])
    Ledger.objects.create(name=f"log-{name}-{local.record['caller']}-{local.record['seq']}")


def added(request: HttpRequest, name: str) -> HttpResponse:
    read_work_save(name)
    return HttpResponse("added")


def paused(view: Any) -> Any:
    """Inside ``ATOMIC_REQUESTS``'s transaction, around the decorated view: the lock's block has
    ended, the transaction not yet committed."""

    def after_the_view(request: HttpRequest, name: str) -> HttpResponse:
        response = view(request, name)
        worst_moment(local.journal, local.record)
        return response

    return after_the_view


urlpatterns = [
    path(
        "add/<str:name>/",
        paused(lock_view("row:{name}", ttl=TTL, wait=10, release_before_commit=EARLY)(added)),
    ),
]


class Journal:
    def __init__(self, path: Path) -> None:
        self._file = path.open("a", encoding="utf-8")
        self._guard = threading.Lock()

    def write(self, record_type: str, /, **fields: Any) -> None:
        with self._guard:
            self._file.write(json.dumps({"type": record_type, **fields}) + "\n")
            self._file.flush()


def operation(kind: str, rng: random.Random, journal: Journal, caller: str, seq: int) -> None:
    record: dict[str, Any] = {"caller": caller, "seq": seq, "kind": kind, "counted": False}
    local.record = record
    if kind == "view":
        record["row"] = rng.choice(ROWS)
        response = Client(raise_request_exception=False).post(f"/add/{record['row']}/")
        record["counted"] = response.status_code == 200
        record["status"] = response.status_code
    elif kind == "with":
        record["row"] = rng.choice(ROWS)
        try:
            with transaction.atomic():
                with redlock(f"row:{record['row']}", ttl=TTL, wait=10, release_before_commit=EARLY):
                    read_work_save(record["row"])
                worst_moment(journal, record)
            record["counted"] = True
        except Exception as exc:  # noqa: BLE001 (CommitRefused, LockLost, contention: journalled)
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
    else:
        record["owner"] = rng.choice(OWNERS)
        try:
            with redlock(f"acct:{record['owner']}", ttl=TTL, wait=10) as lock:
                record["token"] = lock.fence
                worst_moment(journal, record)
                record["started"] = time.monotonic()
                with transaction.atomic():
                    written = OwnedAccount.objects.filter(owner__name=record["owner"]).update(
                        balance=F("balance") + 1, fence=lock
                    )
            record["committed"] = time.monotonic()
            record["counted"] = written == 1
        except Exception as exc:  # noqa: BLE001 (the guard's refusal, LockLost: journalled)
            record["error"] = f"{type(exc).__name__}: {exc}"[:300]
    journal.write("django", **record)


def caller(index: int, thread: int, journal: Journal, stop_by: float) -> None:
    rng = random.Random(f"{PLAN['seed']}/django/{index}/{thread}")
    local.rng, local.journal = rng, journal
    seq = 0
    try:
        while time.monotonic() < stop_by:
            operation(
                rng.choice(("view", "with", "fenced")), rng, journal, f"{index}/d{thread}", seq
            )
            seq += 1
    except BaseException as exc:
        journal.write("crash", pid=os.getpid(), error=repr(exc)[:500])
        raise
    finally:
        connections.close_all()


def setup() -> None:
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)
    for name in ROWS:
        Ledger.objects.update_or_create(name=name, defaults={"value": 0, "fence": 0})
    for name in OWNERS:
        owner, _ = Owner.objects.get_or_create(name=name)
        OwnedAccount.objects.filter(owner=owner).delete()
        OwnedAccount.objects.create(owner=owner, balance=0)


def main() -> None:
    if sys.argv[2] == "setup":
        setup()
        return
    index = int(sys.argv[2])
    connections.settings["default"]["ATOMIC_REQUESTS"] = True
    journal = Journal(Path(PLAN["journal_dir"]) / f"django-{index}.jsonl")
    # This script's folder is first on the path (it runs by its path, as client.py does).
    from client import started_together

    stop_by = started_together(PLAN, f"django-{index}")
    threads = [
        threading.Thread(target=caller, args=(index, t, journal, stop_by))
        for t in range(1 if SOLO else PLAN["threads"])
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main()
