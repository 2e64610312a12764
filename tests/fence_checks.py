"""What a fenced model must do, written once and run on each database: in the test process on
SQLite (tests/test_fencing.py), and in a child process on a throwaway PostgreSQL cluster:

    python -m tests.fence_checks    (REDLOCK_NODES, REDLOCK_TEST_PG=<port> in the environment)

prints ``OK <check>`` per check that held, then ``DONE``; a failed check raises.
"""

from __future__ import annotations

import os
from collections.abc import Callable

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()

from django.db.models import F  # noqa: E402

from django_redlock import redlock  # noqa: E402
from django_redlock.fencing import StaleWrite, fenced_update  # noqa: E402
from tests.fencedapp.models import Account, Ledger  # noqa: E402


def two_fences(resource: str) -> tuple[int, int]:
    """An older holder's token, then a newer one's (each from a real acquisition)."""
    with redlock(resource, db_guard=False) as first:
        old = first.fence
    with redlock(resource, db_guard=False) as second:
        new = second.fence
    assert new > old, (old, new)
    return old, new


def check_save_refuses_an_older_fence() -> None:
    account = Account.objects.create(name="save", balance=0)
    old, new = two_fences("account:save")
    account.balance = 10
    account.save(fence=new)
    stale = Account.objects.get(pk=account.pk)
    stale.balance = 99
    refused: list[StaleWrite] = []
    try:
        stale.save(fence=old)
    except StaleWrite as error:
        refused.append(error)
    assert refused, "a save with an older fence was accepted"
    assert f"fence {old} was refused" in str(refused[0]), refused
    row = Account.objects.get(pk=account.pk)
    assert (row.balance, row.fence) == (10, new), row


def check_save_with_the_held_lock() -> None:
    account = Account.objects.create(name="held", balance=1)
    with redlock("account:held") as lock:
        account.balance = 2
        account.save(fence=lock)
        account.balance = 3
        account.save(fence=lock)  # the same holder writes twice under its one token
        fence = lock.fence
    row = Account.objects.get(pk=account.pk)
    assert (row.balance, row.fence) == (3, fence), row


def check_save_with_update_fields_still_writes_the_fence() -> None:
    account = Account.objects.create(name="fields", balance=1)
    old, new = two_fences("account:fields")
    account.balance = 5
    account.save(fence=new, update_fields=["balance"])
    assert Account.objects.get(pk=account.pk).fence == new
    account.balance = 6
    try:
        account.save(fence=old, update_fields=["balance"])
    except StaleWrite:
        pass
    else:
        raise AssertionError("an older fence was accepted with update_fields")
    assert Account.objects.get(pk=account.pk).balance == 5


def check_a_new_row_is_inserted_with_its_fence() -> None:
    _, new = two_fences("account:fresh")
    Account(name="fresh", balance=7).save(fence=new)
    assert Account.objects.get(name="fresh").fence == new


def check_queryset_update_writes_only_rows_with_an_older_fence() -> None:
    Account.objects.create(name="q1", balance=0)
    Account.objects.create(name="q2", balance=0)
    old, new = two_fences("account:q")
    rows = Account.objects.filter(name__in=["q1", "q2"])
    assert rows.filter(name="q2").update(balance=F("balance") + 1, fence=new) == 1
    assert rows.update(balance=F("balance") + 10, fence=old) == 1  # q1 only: q2 is newer
    balances = dict(rows.values_list("name", "balance"))
    assert balances == {"q1": 10, "q2": 1}, balances
    assert rows.update(balance=0) == 2  # without a fence: Django's own update


def check_fenced_update_on_a_model_with_its_own_fence_column() -> None:
    Ledger.objects.create(name="ledger-fenced")
    old, new = two_fences("ledger:fenced")
    rows = Ledger.objects.filter(name="ledger-fenced")
    assert fenced_update(rows, new, value=1) == 1
    assert fenced_update(rows, old, value=2) == 0
    assert rows.get().value == 1


CHECKS: list[Callable[[], None]] = [
    check_save_refuses_an_older_fence,
    check_save_with_the_held_lock,
    check_save_with_update_fields_still_writes_the_fence,
    check_a_new_row_is_inserted_with_its_fence,
    check_queryset_update_writes_only_rows_with_an_older_fence,
    check_fenced_update_on_a_model_with_its_own_fence_column,
]


def main() -> None:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", run_syncdb=True, verbosity=0)
    print("VENDOR", connection.vendor, flush=True)
    for check in CHECKS:
        check()
        print("OK", check.__name__, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
