"""A holder in its own process, for fencing tests: acquire, report the fence, wait for the
word "write" on stdin, then write through ``fenced_update`` and report what happened.

    python -m tests.fenced_writer <ttl> [unguarded]   (REDLOCK_NODES, REDLOCK_TEST_DB in the
                                                       environment)

``unguarded``: without the DB guard, so that the write reaches the database and the fence alone
must refuse it.
"""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402

from django_redlock import LockLost, redlock  # noqa: E402
from django_redlock.fencing import fenced_update  # noqa: E402
from tests.fencedapp.models import Ledger  # noqa: E402


def main() -> None:
    call_command("migrate", run_syncdb=True, verbosity=0)
    Ledger.objects.get_or_create(name="ledger")
    try:
        guarded = sys.argv[2:] != ["unguarded"]
        with redlock("ledger", ttl=float(sys.argv[1]), db_guard=guarded) as lock:
            print("HOLDING", lock.fence, flush=True)
            sys.stdin.readline()
            written = fenced_update(
                Ledger.objects.filter(name="ledger"), lock.fence, value=os.getpid()
            )
            print("WROTE", written, "LOST" if lock.lost else "VALID", flush=True)
    except LockLost:
        print("EXIT LockLost", flush=True)
    else:
        print("EXIT ok", flush=True)


if __name__ == "__main__":
    main()
