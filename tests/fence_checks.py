"""What a fenced model must do, written once and run on each database: in the test process on
SQLite (tests/test_fencing.py), and in a child process on a throwaway PostgreSQL cluster:

    python -m tests.fence_checks    (REDLOCK_NODES, REDLOCK_TEST_PG=<port> in the environment)

prints ``OK <check>`` per check that held, then ``DONE``; a failed check raises. The checks of
``RACES`` run only there: two transactions racing for one row, which SQLite serializes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()

from django.core.exceptions import FieldError  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402
from django.db.models import F  # noqa: E402
from django.test.utils import CaptureQueriesContext  # noqa: E402

from django_redlock import redlock  # noqa: E402
from django_redlock.fencing import StaleWrite, fenced_update  # noqa: E402
from tests.fencedapp.models import (  # noqa: E402
    Account,
    BareAccount,
    Document,
    Ledger,
    OwnedAccount,
    Owner,
    Page,
    PremiumAccount,
)


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


def statements_made(write: Callable[[], object]) -> list[str]:
    """The statements ``write()`` sent, as the database ran them."""
    with CaptureQueriesContext(connection) as queries:
        write()
    return [q["sql"] for q in queries.captured_queries]


def updates_made(write: Callable[[], object]) -> list[str]:
    """The UPDATE statements ``write()`` sent."""
    return [sql for sql in statements_made(write) if sql.startswith("UPDATE")]


def fence_term(model: type[Any], token: int) -> str:
    """The fence comparison of ``model``'s table in an UPDATE's own WHERE (a subquery's terms
    name their tables ``U0``, ``U1``...)."""
    return f'"{model._meta.db_table}"."fence" <= {token}'


def check_update_through_a_join_compares_the_fence_in_the_statement_that_writes() -> None:
    owner = Owner.objects.create(name="joined")
    OwnedAccount.objects.create(owner=owner, balance=0)
    old, new = two_fences("owner:joined")
    rows = OwnedAccount.objects.filter(owner__name="joined")  # a join: WHERE id IN (SELECT ...)
    statements = statements_made(lambda: rows.update(balance=F("balance") + 1, fence=new))
    assert len(statements) == 1, statements  # one UPDATE, no read before it
    assert fence_term(OwnedAccount, new) in statements[0], statements
    assert rows.update(balance=100, fence=old) == 0
    assert fenced_update(rows, old, balance=100) == 0
    assert list(rows.values_list("balance", "fence")) == [(1, new)]


def check_update_of_a_multi_table_child_compares_the_fence_in_each_update() -> None:
    PremiumAccount.objects.create(name="premium", balance=0, level=0)
    old, new = two_fences("account:premium")
    rows = PremiumAccount.objects.filter(name="premium")
    statements = updates_made(lambda: rows.update(level=1, balance=1, fence=new))
    assert len(statements) == 2, statements  # the parent's table (the fence), then the child's
    assert fence_term(Account, new) in statements[0], statements
    assert f'"fence" = {new}' in statements[1], statements
    assert rows.update(level=99, balance=99, fence=old) == 0
    assert rows.update(level=99, fence=old) == 0  # only the child's own table: still fenced
    assert list(rows.values_list("level", "balance", "fence")) == [(1, 1, new)]


def check_a_plain_save_leaves_the_fence_alone() -> None:
    account = Account.objects.create(name="plain", balance=0)
    earlier = Account.objects.get(pk=account.pk)  # loaded before the fenced write: fence 0
    old, new = two_fences("account:plain")
    account.save(fence=new)
    earlier.balance = 3
    earlier.save()  # unfenced: writes the balance, not its stale fence
    assert Account.objects.get(pk=account.pk).fence == new
    Account.objects.filter(pk=account.pk).update(balance=4)  # Django's own: the fence untouched
    assert Account.objects.filter(pk=account.pk).update(balance=5, fence=old) == 0
    row = Account.objects.get(pk=account.pk)
    assert (row.balance, row.fence) == (4, new), row


def check_a_child_with_nothing_of_its_own_to_write_is_saved_by_its_holder() -> None:
    bare = BareAccount.objects.create(name="bare", balance=0)
    premium = PremiumAccount.objects.create(name="parentfield", balance=0)
    with redlock("account:children") as lock:
        bare.balance = 1
        bare.save(fence=lock)  # its own table has no fields: nothing to write there
        premium.balance = 2
        premium.save(fence=lock, update_fields=["balance"])  # a parent field only
        premium.balance = 3
        premium.save(fence=lock, update_fields=["balance"])  # twice under the same token
        fence = lock.fence
    assert BareAccount.objects.values_list("balance", "fence").get(pk=bare.pk) == (1, fence)
    row = PremiumAccount.objects.values_list("balance", "fence").get(pk=premium.pk)
    assert row == (3, fence), row


def check_a_child_saved_with_an_older_fence_writes_no_table() -> None:
    premium = PremiumAccount.objects.create(name="olderchild", balance=0, level=0)
    old, new = two_fences("account:olderchild")
    premium.level, premium.balance = 1, 1
    premium.save(fence=new)
    stale = PremiumAccount.objects.get(pk=premium.pk)
    stale.level, stale.balance = 9, 9
    try:
        stale.save(fence=old)
    except StaleWrite:
        pass
    else:
        raise AssertionError("a child's save with an older fence was accepted")
    row = PremiumAccount.objects.values_list("level", "balance", "fence").get(pk=premium.pk)
    assert row == (1, 1, new), row


def check_a_fenced_child_of_a_plain_model_fences_both_tables() -> None:
    page = Page.objects.create(title="first", words=0)
    old, new = two_fences("page")
    page.title, page.words = "second", 2
    page.save(fence=new)
    stale = Page.objects.get(pk=page.pk)
    stale.title, stale.words = "stale", 9
    try:
        stale.save(fence=old)
    except StaleWrite:
        pass
    else:
        raise AssertionError("an older fence was accepted on a fenced child of a plain model")
    rows = Page.objects.filter(title="second")
    assert rows.update(title="stale", words=9, fence=old) == 0
    assert rows.update(title="third", words=3, fence=new) == 1
    assert Document.objects.get(pk=page.pk).title == "third"
    assert Page.objects.values_list("words", "fence").get(pk=page.pk) == (3, new)


def check_bad_fences_and_unfenceable_shapes_are_refused_before_any_query() -> None:
    account = Account.objects.create(name="refused", balance=0)
    rows = Account.objects.filter(pk=account.pk)
    attempts: list[Callable[[], object]] = [
        lambda: rows.update(balance=1, fence="3"),  # TypeError: not a lock, a token or an int
        lambda: account.save(fence=2.0),
        lambda: rows.update(balance=1, fence=0),  # ValueError: a token is >= 1
        lambda: rows[:1].update(balance=1, fence=3),  # TypeError: Django's, a slice
        lambda: rows.union(rows).update(balance=1, fence=3),  # UnfenceableUpdate
        lambda: fenced_update(Owner.objects.all(), 3, name="x"),  # FieldError: no fence column
    ]
    for attempt in attempts:
        with CaptureQueriesContext(connection) as queries:
            try:
                attempt()
            except (TypeError, ValueError, FieldError):
                pass
            else:
                raise AssertionError("a bad fenced write was not refused")
        assert queries.captured_queries == [], queries.captured_queries
    assert Account.objects.values_list("balance", "fence").get(pk=account.pk) == (0, 0)


CHECKS: list[Callable[[], None]] = [
    check_save_refuses_an_older_fence,
    check_save_with_the_held_lock,
    check_save_with_update_fields_still_writes_the_fence,
    check_a_new_row_is_inserted_with_its_fence,
    check_queryset_update_writes_only_rows_with_an_older_fence,
    check_fenced_update_on_a_model_with_its_own_fence_column,
    check_update_through_a_join_compares_the_fence_in_the_statement_that_writes,
    check_update_of_a_multi_table_child_compares_the_fence_in_each_update,
    check_a_plain_save_leaves_the_fence_alone,
    check_a_child_with_nothing_of_its_own_to_write_is_saved_by_its_holder,
    check_a_child_saved_with_an_older_fence_writes_no_table,
    check_a_fenced_child_of_a_plain_model_fences_both_tables,
    check_bad_fences_and_unfenceable_shapes_are_refused_before_any_query,
]


def older_after_newer(newer: Callable[[], object], older: Callable[[], int]) -> int:
    """Run ``newer()`` in a transaction that stays open, then ``older()`` in another thread (its
    own connection) until it waits for the row lock ``newer`` holds; then commit ``newer``.
    Returns what ``older()`` wrote once the commit let it through. (PostgreSQL: READ COMMITTED
    checks the outer WHERE of the waiting UPDATE again on the committed row, nothing else.)"""
    wrote, commit = threading.Event(), threading.Event()
    result: dict[str, Any] = {}

    def hold_newer() -> None:
        try:
            with transaction.atomic():
                newer()
                wrote.set()
                commit.wait(30)
        finally:
            connections.close_all()

    def run_older() -> None:
        try:
            connection.ensure_connection()
            result["pid"] = connection.connection.info.backend_pid
            result["written"] = older()
        except Exception as error:  # noqa: BLE001 (re-raised in the checking thread)
            result["error"] = error
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_newer)
    holder.start()
    try:
        assert wrote.wait(30), "the newer holder did not write"
        waiter = threading.Thread(target=run_older)
        waiter.start()
        deadline = time.monotonic() + 30
        while not waits_for_a_lock(result.get("pid")):
            assert waiter.is_alive(), result  # older() must wait for newer's row lock
            assert time.monotonic() < deadline, "older() never waited for the row lock"
            time.sleep(0.01)
    finally:
        commit.set()
        holder.join(30)
    waiter.join(30)
    if "error" in result:
        raise result["error"]
    return int(result["written"])


def waits_for_a_lock(pid: int | None) -> bool:
    if pid is None:
        return False
    with connection.cursor() as cursor:
        cursor.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", [pid])
        row = cursor.fetchone()
    return row is not None and row[0] == "Lock"


def check_race_an_older_update_through_a_join_never_overwrites_a_newer_one() -> None:
    owner = Owner.objects.create(name="racing")
    OwnedAccount.objects.create(owner=owner, balance=0)
    old, new = two_fences("owner:racing")
    rows = OwnedAccount.objects.filter(owner__name="racing")
    written = older_after_newer(
        lambda: rows.update(balance=7, fence=new), lambda: rows.update(balance=6, fence=old)
    )
    assert written == 0, f"the older token {old} wrote over {new}"
    assert list(rows.values_list("balance", "fence")) == [(7, new)]


def check_race_an_older_update_of_a_child_never_overwrites_a_newer_one() -> None:
    PremiumAccount.objects.create(name="racingchild", balance=0, level=0)
    old, new = two_fences("account:racingchild")
    rows = PremiumAccount.objects.filter(name="racingchild")
    written = older_after_newer(
        lambda: rows.update(level=7, balance=7, fence=new),
        lambda: rows.update(level=6, balance=6, fence=old),
    )
    assert written == 0, f"the older token {old} wrote over {new}"
    assert list(rows.values_list("level", "balance", "fence")) == [(7, 7, new)]


def check_race_an_older_update_of_a_fenced_child_of_a_plain_model_writes_no_table() -> None:
    page = Page.objects.create(title="racing", words=0)
    old, new = two_fences("page:racing")
    rows = Page.objects.filter(pk=page.pk)
    written = older_after_newer(
        lambda: rows.update(title="newer", words=7, fence=new),
        lambda: rows.update(title="older", words=6, fence=old),
    )
    assert written == 0, f"the older token {old} wrote over {new}"
    assert list(rows.values_list("title", "words", "fence")) == [("newer", 7, new)]


def check_race_an_older_save_of_a_child_writes_no_table() -> None:
    premium = PremiumAccount.objects.create(name="racingsave", balance=0, level=0)
    old, new = two_fences("account:racingsave")
    newer, older = (PremiumAccount.objects.get(pk=premium.pk) for _ in range(2))
    newer.balance, newer.level = 7, 7
    older.balance, older.level = 6, 6
    refused: list[StaleWrite] = []

    def save_older() -> int:
        try:
            older.save(fence=old)
        except StaleWrite as error:
            refused.append(error)
            return 0
        return 1

    assert older_after_newer(lambda: newer.save(fence=new), save_older) == 0
    assert refused, "the older save was accepted"
    row = PremiumAccount.objects.values_list("balance", "level", "fence").get(pk=premium.pk)
    assert row == (7, 7, new), row


RACES: list[Callable[[], None]] = [
    check_race_an_older_update_through_a_join_never_overwrites_a_newer_one,
    check_race_an_older_update_of_a_child_never_overwrites_a_newer_one,
    check_race_an_older_update_of_a_fenced_child_of_a_plain_model_writes_no_table,
    check_race_an_older_save_of_a_child_writes_no_table,
]


def main() -> None:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", run_syncdb=True, verbosity=0)
    print("VENDOR", connection.vendor, flush=True)
    for check in [*CHECKS, *RACES]:
        check()
        print("OK", check.__name__, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
