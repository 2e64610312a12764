"""Held until the transaction ends: each check of tests/transaction_checks.py, in a child
process on SQLite (a file) and on a throwaway PostgreSQL cluster; and the opt-out's bad values,
refused before any network call."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from django_redlock import locked, redlock
from tests import transaction_checks
from tests.conftest import checks_in_a_child


def test_on_sqlite(masters, tmp_path: Path) -> None:
    database = {"REDLOCK_TEST_DB": str(tmp_path / "db.sqlite3")}
    lines = checks_in_a_child(
        "tests.transaction_checks", transaction_checks.CHECKS, masters, database
    )
    assert lines[0] == "VENDOR sqlite"


def test_on_postgresql(postgres_port, masters) -> None:
    database = {"REDLOCK_TEST_PG": str(postgres_port)}
    lines = checks_in_a_child(
        "tests.transaction_checks", transaction_checks.CHECKS, masters, database
    )
    assert lines[0] == "VENDOR postgresql"


BAD = ["yes", 1, 0, None, 1.0]


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_release_before_commit_that_is_not_a_bool_is_refused_naming_it(bad, settings) -> None:
    # No masters at all: refused before any network call.
    settings.REDLOCK = {"NODES": ["redis://127.0.0.1:1/0"]}
    from django_redlock.commands import guard_command
    from django_redlock.decorators import lock_view

    message = f"release_before_commit must be True or False, got {bad!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        redlock("bad:input", release_before_commit=bad)
    with pytest.raises(ValueError, match=re.escape(message)):
        redlock("bad:input", auto_extend=True, release_before_commit=bad)
    with pytest.raises(ValueError, match=re.escape(message)):
        lock_view("bad:input", release_before_commit=bad)
    with pytest.raises(ValueError, match=re.escape(message)):
        locked("bad:input", release_before_commit=bad)(lambda: None)()
    with (
        pytest.raises(ValueError, match=re.escape(message)),
        guard_command("bad", release_before_commit=bad),
    ):
        pass
    lock = redlock("bad:input")
    with pytest.raises(ValueError, match=re.escape(message)):
        lock.release_before_commit = bad


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_redlock_task_with_a_bad_release_before_commit_is_refused(bad) -> None:
    from celery import Celery

    from django_redlock.contrib.celery import RedlockTask

    app = Celery("bad_input", broker="memory://", set_as_current=False)
    message = f"release_before_commit must be True or False, got {bad!r}"

    def run(n: int) -> None: ...

    task = app.task(base=RedlockTask, lock_key="k:{n}", lock_release_before_commit=bad)(run)
    with pytest.raises(ValueError, match=re.escape(message)):
        task.run  # noqa: B018 (builds the task's class)


def test_the_opt_out_is_a_layer_option_of_its_own(settings) -> None:
    settings.REDLOCK = {"NODES": ["redis://127.0.0.1:1/0"]}
    assert redlock("opt:out").release_before_commit is False
    assert redlock("opt:out", release_before_commit=True).release_before_commit is True
    lock = redlock("opt:out", template="opt:{x}")
    lock.release_before_commit = True
    assert (lock.release_before_commit, lock.template) == (True, "opt:{x}")
    assert redlock("opt:out").release_before_commit is False  # the shared defaults untouched


@pytest.mark.django_db  # Django's TestCase transaction: never committed, so nothing to wait for
def test_inside_a_testcase_transaction_the_lock_is_released_at_its_blocks_end(
    redlock_settings,
) -> None:
    from django.db import connection

    from django_redlock import is_locked
    from django_redlock import transactions as waiting

    assert connection.in_atomic_block
    with redlock("testcase:txn"):
        pass
    assert not is_locked("testcase:txn")
    assert not waiting.holds


@pytest.mark.django_db(transaction=True)
def test_a_lock_cycle_outside_any_transaction_waits_for_nothing(redlock_settings) -> None:
    from django_redlock import is_locked
    from django_redlock import transactions as waiting
    from tests.fencedapp.models import Ledger

    Ledger.objects.create(name="outside")  # the database is in use: locks look at it
    assert waiting.databases_used
    with redlock("outside:txn"):
        Ledger.objects.filter(name="outside").update(value=1)
    assert not is_locked("outside:txn")
    assert not waiting.holds
