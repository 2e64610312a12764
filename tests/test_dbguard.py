"""The DB guard: once a guarded lock's lease is lost (force release) or its validity is over
(a short TTL outlived), the block's next query raises LockLost before reaching the database, and
open atomic blocks are marked for rollback. Real masters, real SQLite, real requests."""

from __future__ import annotations

import contextvars
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction
from django.db.models import F
from django.test import Client

from django_redlock import LockLost, locked, redlock
from django_redlock.conf import get_redlock
from django_redlock.dbguard import refuse_stale_queries
from tests import guard_checks
from tests.conftest import ROOT, checks_in_a_child, wait_until
from tests.fencedapp.models import Ledger

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.urls("tests.fencedapp.urls"),
]

#: The lease: 1 s, so that what a block does within its validity (a query, a write) is done in
#: time on a loaded machine (0.3 s left an acquisition and a query 0.3 s). Every pause below
#: outlives it: its validity is counted from before the acquisition, the pause from after, and
#: a loaded machine only makes a pause longer.
TTL = 1.0
PAUSE = TTL + 0.1


def value(name: str = "row") -> int:
    return Ledger.objects.get(name=name).value


def force_release_later(masters, resource: str, after: float) -> threading.Thread:
    """Delete the lock's key on every master ``after`` seconds after it is held there, as an
    operator would (counted from the grant seen, not from now: a loaded machine may take
    longer than ``after`` to start the request that takes it)."""
    key = get_redlock().lock_key(resource)

    def release() -> None:
        assert wait_until(lambda: all(m.call("EXISTS", key) for m in masters), 10), key
        time.sleep(after)
        for master in masters:
            master.call("DEL", key)

    thread = threading.Thread(target=release)
    thread.start()
    return thread


def test_a_query_after_the_validity_ran_out_is_refused_before_the_database(redlock_settings):
    Ledger.objects.create(name="row")
    refused: list[LockLost] = []

    def stale_holder() -> None:
        with redlock("ledger:row", ttl=TTL):
            assert value() == 0  # within validity: queries pass
            time.sleep(PAUSE)
            try:
                Ledger.objects.filter(name="row").update(value=F("value") + 1)
            except LockLost as error:
                refused.append(error)

    with pytest.raises(LockLost):  # leaving the block: the lease was lost
        stale_holder()
    assert "refused before it reached the database" in str(refused[0])
    assert value() == 0


def test_the_open_transaction_is_marked_for_rollback_even_if_the_error_is_caught(
    redlock_settings,
):
    Ledger.objects.create(name="row")
    marked: list[bool] = []

    def careless_holder() -> None:
        with redlock("ledger:row", ttl=TTL), transaction.atomic():
            Ledger.objects.filter(name="row").update(value=1)  # written while valid
            time.sleep(PAUSE)
            try:
                Ledger.objects.filter(name="row").update(value=2)
            except LockLost:
                pass  # a careless caller: the transaction must still not commit
            marked.append(transaction.get_rollback())

    with pytest.raises(LockLost):
        careless_holder()
    assert marked == [True]
    assert value() == 0  # the write made while valid was rolled back with the rest


def test_a_nested_atomic_rolls_back_cleanly(redlock_settings):
    """The savepoint's ROLLBACK TO passes the guard: Django's transaction state stays sound."""
    Ledger.objects.create(name="row")

    def nested() -> None:
        with redlock("ledger:row", ttl=TTL), transaction.atomic(), transaction.atomic():
            time.sleep(PAUSE)
            Ledger.objects.filter(name="row").update(value=2)

    with pytest.raises(LockLost, match="refused before it reached the database"):
        nested()
    assert not connection.in_atomic_block
    assert value() == 0


def test_queries_after_the_block_are_not_guarded_any_more(redlock_settings):
    Ledger.objects.create(name="row")

    def idle_holder() -> None:
        with redlock("ledger:row", ttl=TTL):
            time.sleep(PAUSE)

    with pytest.raises(LockLost):
        idle_holder()
    Ledger.objects.filter(name="row").update(value=5)
    assert value() == 5


def test_a_reentered_block_leaves_the_outer_one_guarded_and_nothing_behind(redlock_settings):
    """Each entry guards and each exit unguards one: the inner block's exit (no round: the
    outer one still holds the lease) leaves the outer block guarded, and the outer block's exit
    leaves no entry of the lease in the context."""
    Ledger.objects.create(name="row")
    before = len(dbguard_entries())  # (left by earlier tests in this context: released leases)

    def reentering_holder() -> None:
        with redlock("ledger:row", ttl=TTL, reentrant=True):
            with redlock("ledger:row", ttl=TTL, reentrant=True):
                assert len(dbguard_entries()) == before + 2
            assert len(dbguard_entries()) == before + 1
            time.sleep(PAUSE)
            Ledger.objects.filter(name="row").update(value=4)

    with pytest.raises(LockLost, match="refused before it reached the database"):
        reentering_holder()
    assert len(dbguard_entries()) == before
    Ledger.objects.filter(name="row").update(value=5)
    assert value() == 5


def dbguard_entries() -> tuple[object, ...]:
    """The leases guarding the current context's queries."""
    from django_redlock import dbguard

    return dbguard._guarded.get()


def test_db_guard_false_lets_the_stale_query_through(redlock_settings):
    Ledger.objects.create(name="row")

    def unguarded_holder() -> None:
        with redlock("ledger:row", ttl=TTL, db_guard=False):
            time.sleep(PAUSE)
            Ledger.objects.filter(name="row").update(value=7)  # the hazard the guard is for

    with pytest.raises(LockLost):  # only on leaving the block: the write went through
        unguarded_holder()
    assert value() == 7


def test_locked_decorator_is_guarded(redlock_settings):
    Ledger.objects.create(name="row")

    @locked("ledger:{name}", ttl=TTL)
    def add_after_pause(name: str) -> None:
        time.sleep(PAUSE)
        Ledger.objects.filter(name=name).update(value=F("value") + 1)

    with pytest.raises(LockLost, match="refused before it reached the database"):
        add_after_pause("row")
    assert value() == 0


def test_a_locked_generator_is_guarded_while_it_holds(redlock_settings):
    Ledger.objects.create(name="row")

    @locked("ledger:{name}", ttl=TTL)
    def add_after_pause(name: str) -> Iterator[int]:
        time.sleep(PAUSE)
        yield Ledger.objects.filter(name=name).update(value=F("value") + 1)

    with pytest.raises(LockLost, match="refused before it reached the database"):
        list(add_after_pause("row"))
    assert value() == 0


def test_async_block_guards_the_orm_in_sync_to_async_threads(redlock_settings):
    """The ContextVar travels into sync_to_async: the executor thread's query is refused."""
    Ledger.objects.create(name="row")

    async def stale_write() -> None:
        async with redlock("ledger:row", ttl=TTL):
            await Ledger.objects.aget(name="row")
            time.sleep(PAUSE)  # blocks the loop on purpose: a paused holder
            await Ledger.objects.filter(name="row").aupdate(value=9)

    with pytest.raises(LockLost, match="refused before it reached the database"):
        async_to_sync(stale_write)()
    assert value() == 0


def test_a_connection_a_thread_opens_with_the_blocks_context_is_guarded(redlock_settings):
    """A thread given the block's context (as asyncio.to_thread does) opens its own connection:
    the guard is put on it as it connects."""
    Ledger.objects.create(name="row")
    refused: list[LockLost] = []

    def query_in_a_new_thread() -> None:
        try:
            Ledger.objects.filter(name="row").update(value=3)
        except LockLost as error:
            refused.append(error)
        finally:
            connection.close()

    def stale_holder() -> None:
        with redlock("ledger:row", ttl=TTL):
            time.sleep(PAUSE)
            worker = threading.Thread(
                target=contextvars.copy_context().run, args=(query_in_a_new_thread,)
            )
            worker.start()
            worker.join()

    with pytest.raises(LockLost):
        stale_holder()
    assert len(refused) == 1
    assert value() == 0


def test_a_request_whose_lock_was_force_released_cannot_write(redlock_settings):
    """lock_view renews every 1/3 s: the renewal after the force release finds the lease gone
    (or, late, its 1 s validity runs out), and the view's UPDATE, 1.2 s in, is refused."""
    Ledger.objects.create(name="row")
    releaser = force_release_later(redlock_settings, "ledger:row", after=0.2)
    with pytest.raises(LockLost, match="refused before it reached the database"):
        Client().get("/add/row/?pause=1.2")
    releaser.join()
    assert value() == 0
    assert Client().get("/add/row/").status_code == 200  # an unhurried request still writes
    assert value() == 1


def test_an_async_request_whose_lock_was_force_released_cannot_write(redlock_settings):
    Ledger.objects.create(name="row")
    releaser = force_release_later(redlock_settings, "ledger:row", after=0.2)
    with pytest.raises(LockLost, match="refused before it reached the database"):
        Client().get("/aadd/row/?pause=1.2")
    releaser.join()
    assert value() == 0


def test_the_guard_sits_first_so_a_users_own_wrapper_block_removes_its_own(redlock_settings):
    """``connection.execute_wrapper()`` pops the *last* wrapper when its block ends."""
    Ledger.objects.create(name="row")
    seen: list[str] = []

    def spy(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(spy), redlock("ledger:row", ttl=5):
        value()
    assert connection.execute_wrappers == [refuse_stale_queries]
    assert seen


def test_db_guard_must_be_a_bool(redlock_settings):
    with pytest.raises(ValueError, match="db_guard must be True or False, got 'yes'"):
        redlock("ledger:row", db_guard="yes")  # type: ignore[arg-type]


def test_with_no_database_configured_the_guard_is_a_no_op(masters):
    """DATABASES = {}: a guarded block enters, runs and leaves as any other (a child process:
    the settings differ from the suite's)."""
    program = (
        "import django\n"
        "from django.conf import settings\n"
        f"settings.configure(INSTALLED_APPS=['django_redlock'], DATABASES={{}},\n"
        f"                   REDLOCK={{'NODES': {[m.url for m in masters]!r}}})\n"
        "django.setup()\n"
        "from django_redlock import redlock\n"
        "with redlock('no-database', ttl=5) as lock:\n"
        "    print('HELD', lock.held)\n"
    )
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-c", program],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "HELD True\n"


# --- the guard follows the caller: an acquisition run in a child task guards its caller ------
# (tests/guard_checks.py: written once, run here on SQLite and in a child on PostgreSQL)


@pytest.mark.parametrize("check", guard_checks.CHECKS, ids=lambda c: c.__name__)
def test_on_sqlite(check, redlock_settings):
    check()


def test_on_postgresql(postgres_port, masters):
    database = {"REDLOCK_TEST_PG": str(postgres_port)}
    lines = checks_in_a_child("tests.guard_checks", guard_checks.CHECKS, masters, database)
    assert lines[0] == "VENDOR postgresql"
