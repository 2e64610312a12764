"""One holder of the stale-writer chaos scenario (tests/test_stale_writers.py), in its own process
so that it can be SIGSTOPped for real. Driven over stdin/stdout, one line each:

    python -m tests.stale_writer <ttl>    (REDLOCK_NODES and REDLOCK_TEST_PG in the environment)

Says ``READY`` (after migrating), then:
    ``reset``  -> ``OK``: the ledger row back to value 0, fence 0
    ``hold <guard|noguard> <fence|nofence>``
               -> a JSON line ``{"pid": ...}``: lock "ledger" acquired (auto-extended), a
                  transaction opened and the row's value read: the read of a read-modify-write
    ``write``  -> a JSON line: the section as bench.chaos.checkers.Section records it, after
                  writing value + 1 (fenced or not), committing, and leaving the lock's block
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402

from django_redlock import LockLost, redlock  # noqa: E402
from django_redlock.fencing import fenced_update  # noqa: E402
from tests.fencedapp.models import Ledger  # noqa: E402

ROW = "stale-writers"


def section(guarded: bool, fenced: bool, ttl: float) -> dict[str, object]:
    record: dict[str, object] = {"counted": False, "fenced": None, "wrote_at": None}
    try:
        with redlock("ledger", ttl=ttl, wait=5, auto_extend=True, db_guard=guarded) as lock:
            record["acquired"] = time.monotonic()
            record["valid_until"] = record["acquired"] + lock.validity  # type: ignore[operator]
            record["fence"] = fence = lock.fence
            try:
                with transaction.atomic():
                    value = Ledger.objects.get(name=ROW).value
                    print(json.dumps({"pid": os.getpid(), "read": value}), flush=True)
                    sys.stdin.readline()  # "write": here the test SIGSTOPs us, then resumes us
                    rows = Ledger.objects.filter(name=ROW)
                    record["wrote_at"] = time.monotonic()
                    if fenced:
                        written = fenced_update(rows, fence, value=value + 1)
                        record["fenced"] = written == 1
                    else:
                        written = rows.update(value=value + 1)
                record["counted"] = written == 1  # committed: this section wrote the counter
            except LockLost as error:  # the DB guard refused the query
                record["note"] = f"{type(error).__name__}: {error}"
            record["released"] = time.monotonic()
        record["lost"] = False
    except LockLost:  # leaving the block: the lease was lost inside it
        record["lost"] = True
    return record


def main() -> None:
    ttl = float(sys.argv[1])
    call_command("migrate", run_syncdb=True, verbosity=0)
    print("READY", flush=True)
    for line in sys.stdin:
        command, *config = line.split()
        if command == "reset":
            Ledger.objects.update_or_create(name=ROW, defaults={"value": 0, "fence": 0})
            print("OK", flush=True)
        elif command == "hold":
            guarded, fenced = config[0] == "guard", config[1] == "fence"
            print(json.dumps(section(guarded, fenced, ttl)), flush=True)


if __name__ == "__main__":
    main()
