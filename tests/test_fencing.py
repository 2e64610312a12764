"""Fenced models on SQLite (here) and PostgreSQL (a child process on a throwaway cluster): an
older fence is refused in the UPDATE itself; bad fences are refused before any query."""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.apps import apps
from django.core.exceptions import FieldDoesNotExist, FieldError
from django.db import models
from django.test.utils import isolate_apps

from django_redlock import redlock
from django_redlock.fencing import (
    FencedModel,
    UnfenceableUpdate,
    fence_token,
    fenced_update,
    unfenced_managers,
)
from tests import fence_checks
from tests.conftest import checks_in_a_child
from tests.fencedapp.models import Account, Ledger, Owner


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("check", fence_checks.CHECKS, ids=lambda c: c.__name__)
def test_on_sqlite(check, redlock_settings):
    check()


def test_on_postgresql(postgres_port, masters):
    checks = [*fence_checks.CHECKS, *fence_checks.RACES]
    database = {"REDLOCK_TEST_PG": str(postgres_port)}
    lines = checks_in_a_child("tests.fence_checks", checks, masters, database)
    assert lines[0] == "VENDOR postgresql"


@pytest.mark.parametrize("bad", [-1, 0])
def test_a_fence_that_is_not_a_positive_int_is_a_value_error(bad):
    with pytest.raises(ValueError, match=f"got {bad!r}"):
        fence_token(bad)


@pytest.mark.parametrize("bad", [1.5, "3", True, None, object()])
def test_a_fence_that_is_neither_a_lock_nor_an_int_is_a_type_error(bad):
    with pytest.raises(TypeError, match=re.escape(f"got {bad!r} ({type(bad).__name__})")):
        fence_token(bad)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("bad", ["3", 2.0, None])
def test_a_bad_fence_is_a_type_error_in_every_fenced_write(bad, django_assert_num_queries):
    account = Account.objects.create(name="typed")
    rows = Account.objects.filter(pk=account.pk)
    with django_assert_num_queries(0):
        with pytest.raises(TypeError, match=re.escape(repr(bad))):
            rows.update(balance=1, fence=bad)
        with pytest.raises(TypeError, match=re.escape(repr(bad))):
            fenced_update(rows, bad, balance=1)
        if bad is not None:  # save(fence=None) is the unfenced save
            with pytest.raises(TypeError, match=re.escape(repr(bad))):
                account.save(fence=bad)


@pytest.mark.django_db(transaction=True)
def test_updates_that_cannot_carry_the_fence_are_refused_before_any_query(
    django_assert_num_queries,
):
    rows = Account.objects.filter(name="shape")
    with django_assert_num_queries(0):
        with pytest.raises(TypeError, match="slice"):
            rows[:1].update(balance=1, fence=3)
        with pytest.raises(UnfenceableUpdate, match=r"combined queryset \(union\).*pk__in"):
            rows.union(Account.objects.filter(name="other")).update(balance=1, fence=3)
        with pytest.raises(TypeError, match="writes the fence 'value' itself"):
            fenced_update(Ledger.objects.all(), 3, fence_field="value", value=4)
        with pytest.raises(FieldError, match="fencedapp.Owner has no fence column 'fence'"):
            fenced_update(Owner.objects.all(), 3, name="x")
        with pytest.raises(FieldDoesNotExist, match="no field named 'nosuch'"):
            rows.update(nosuch=1, fence=3)  # Django's own check, before any query


@pytest.mark.django_db(transaction=True)
def test_a_fenced_save_without_the_lock_held_is_a_clear_error(redlock_settings):
    account = Account.objects.create(name="unheld")
    lock = redlock("account:unheld")
    with pytest.raises(RuntimeError, match="a fenced write needs a held lock"):
        account.save(fence=lock)
    with pytest.raises(RuntimeError, match="a fenced write needs a held lock"):
        Account.objects.filter(pk=account.pk).update(balance=1, fence=lock)
    assert Account.objects.get(pk=account.pk).fence == 0


@pytest.mark.django_db(transaction=True)
def test_a_bad_fence_is_refused_before_any_query(redlock_settings, django_assert_num_queries):
    account = Account.objects.create(name="bad")
    with django_assert_num_queries(0), pytest.raises(ValueError, match="got -3"):
        account.save(fence=-3)


@pytest.mark.django_db(transaction=True)
def test_async_writes_read_the_fence_of_the_task_that_holds_the_lock(redlock_settings):
    account = Account.objects.create(name="async")

    async def write() -> int:
        async with redlock("account:async") as lock:
            account.balance = 4
            await account.asave(fence=lock)
            rows = Account.objects.filter(pk=account.pk)
            assert await rows.aupdate(balance=5, fence=lock) == 1
            return await lock.afence()

    fence = async_to_sync(write)()
    row = Account.objects.get(pk=account.pk)
    assert (row.balance, row.fence) == (5, fence)


@isolate_apps("tests.fencedapp")
def test_a_fenced_model_whose_manager_is_a_plain_bases_is_a_check_error():
    """``class Page(Document, FencedModel)``: Document's manager is the default, and its
    ``update(fence=3)`` would write 3 as the fence with no comparison."""

    class Base(models.Model):  # noqa: DJ008
        class Meta:
            app_label = "fencedapp"

    class Wrong(Base, FencedModel):  # noqa: DJ008
        class Meta:
            app_label = "fencedapp"

    class Right(FencedModel, Base):  # noqa: DJ008
        class Meta:
            app_label = "fencedapp"

    errors = unfenced_managers([Base, Wrong, Right])
    assert [(e.id, e.obj) for e in errors] == [("django_redlock.E010", Wrong)]
    assert "name FencedModel first among Wrong's bases" in errors[0].hint
    assert unfenced_managers(apps.get_models()) == []  # the suite's own models are right
