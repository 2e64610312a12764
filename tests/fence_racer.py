"""One holder of the fence-race chaos scenario (tests/test_stale_writers.py), in its own process
so that it can be SIGSTOPped for real: fenced updates over a join and on a multi-table child,
on PostgreSQL. Driven over stdin/stdout, one line each:

    python -m tests.fence_racer <ttl>    (REDLOCK_NODES and REDLOCK_TEST_PG in the environment)

Says ``READY`` (after migrating), then:
    ``seed``   -> ``OK``: the row of each shape back to balance 0, fence 0
    ``hold <join|child> <fenced|broken>``
               -> a JSON line ``{"pid", "backend", "fence"}``: lock "fence-race" taken
                  (auto-extended; no DB guard: the fence alone must hold), a transaction opened
                  and the row's balance read: the read of a read-modify-write
    ``write``  -> a JSON line ``{"written": rows}``: balance + 1 written with the fence, the
                  transaction still open. ``fenced``: the queryset's ``update(..., fence=)``;
                  ``broken``: the fence in the rows' selection instead, as 531ce3f wrote it
                  (``UPDATE ... WHERE id IN (SELECT ... fence <= t)``, or ids read first)
    ``commit`` -> a JSON line: the section as bench.chaos.checkers.Section records it, plus
                  ``committed`` (monotonic time of the commit), after leaving the lock's block
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, models, transaction  # noqa: E402

from django_redlock import LockLost, redlock  # noqa: E402
from tests.fencedapp.models import OwnedAccount, Owner, PremiumAccount  # noqa: E402

NAME = "fence-race"


def rows(shape: str) -> models.QuerySet[Any]:
    """The row of ``shape``: selected through a join, or a multi-table child's."""
    if shape == "join":
        return OwnedAccount.objects.filter(owner__name=NAME)
    return PremiumAccount.objects.filter(name=NAME)


def write(shape: str, mode: str, balance: int, token: int) -> int:
    changes: dict[str, Any] = {"balance": balance}
    if shape == "child":
        changes["level"] = token  # a field of the child's own table, written with the parent's
    if mode == "fenced":
        return rows(shape).update(**changes, fence=token)
    # 531ce3f's fenced_update: the comparison only in the selection of the rows.
    return models.QuerySet.update(rows(shape).filter(fence__lte=token), **changes, fence=token)


def section(shape: str, mode: str, ttl: float) -> dict[str, object]:
    record: dict[str, object] = {"counted": False, "fenced": None, "wrote_at": None}
    try:
        # One lock for both rows: its tokens strictly increase across them (the checkers' order).
        with redlock(NAME, ttl=ttl, wait=10, auto_extend=True, db_guard=False) as lock:
            record["acquired"] = time.monotonic()
            record["valid_until"] = record["acquired"] + lock.validity  # type: ignore[operator]
            record["fence"] = token = lock.fence
            with transaction.atomic():
                balance = rows(shape).values_list("balance", flat=True).get()
                backend = connection.connection.info.backend_pid  # type: ignore[union-attr]
                say({"pid": os.getpid(), "backend": backend, "fence": token})
                sys.stdin.readline()  # "write": here the test SIGSTOPs us, then resumes us
                record["wrote_at"] = time.monotonic()
                written = write(shape, mode, balance + 1, token)
                record["fenced"] = written == 1
                say({"written": written})
                sys.stdin.readline()  # "commit"
            record["committed"] = time.monotonic()
            record["counted"] = written == 1  # committed: this section wrote the balance
            record["released"] = time.monotonic()
        record["lost"] = False
    except LockLost:  # leaving the block: the lease was lost inside it
        record["lost"] = True
    return record


def say(line: object) -> None:
    print(json.dumps(line), flush=True)


def main() -> None:
    ttl = float(sys.argv[1])
    call_command("migrate", run_syncdb=True, verbosity=0)
    print("READY", flush=True)
    for line in sys.stdin:
        command, *config = line.split()
        if command == "seed":
            owner, _ = Owner.objects.get_or_create(name=NAME)
            OwnedAccount.objects.filter(owner=owner).delete()
            OwnedAccount.objects.create(owner=owner)
            PremiumAccount.objects.filter(name=NAME).delete()
            PremiumAccount.objects.create(name=NAME)
            print("OK", flush=True)
        elif command == "hold":
            say(section(config[0], config[1], ttl))


if __name__ == "__main__":
    main()
