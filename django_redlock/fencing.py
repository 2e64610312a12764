"""Fenced writes: the protected rows themselves refuse a holder whose lock was lost.

A lock cannot stop a holder that paused past its lease (GC, SIGSTOP, a slow disk) from waking up
and writing, nor recall a query already sent when the lease ran out. The fencing token can: the
row keeps the token of the last accepted write, and a write is accepted only with a higher one,
checked by the database in the statement that writes the row (``UPDATE ... SET ..., fence = %s
WHERE pk = %s AND fence <= %s``), never read-then-write. (``<=``: a holder may write its rows
twice under its one token; any other holder's token is different, and only an older one is
refused.) Tokens come from ``lock.fence``, which strictly increases per resource across all
holders.

Whatever the queryset, the comparison is in the *outer* WHERE of the UPDATE that writes the
table holding the fence, the only part PostgreSQL checks again on a row it had to wait for: a
filter across a relation becomes ``WHERE pk IN (SELECT ...) AND fence <= t``, and a multi-table
child writes that table first, then its other tables in the same transaction where the fence
is now ours (``_write``). Shapes that cannot carry it are refused before any query.

    class Account(FencedModel):             # adds ``fence`` and a fenced queryset
        balance = models.IntegerField()

    with redlock(f"account:{pk}") as lock:
        account = Account.objects.get(pk=pk)
        account.balance += 10
        account.save(fence=lock)            # StaleWrite if a newer holder wrote the row
        Account.objects.filter(pk=pk).update(balance=F("balance") + 1, fence=lock)  # rows written

``fence=`` takes the held ``Lock`` (its ``fence`` is read) or the token itself (an int >= 1; in
async code, ``await lock.afence()``). Without ``fence=``, ``save()`` and ``update()`` are Django's
own, unfenced, except that ``save()`` leaves the fence column alone: a row's fence never goes
backwards. A model of your own can carry a ``FenceField`` instead of inheriting
``FencedModel``, and write through ``fenced_update(queryset, lock, **changes)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any, ClassVar, cast

from django.apps import apps
from django.core import checks
from django.core.exceptions import FieldDoesNotExist, FieldError
from django.db import connections, models, router, transaction
from django.db.models import QuerySet
from django.db.models.sql import UpdateQuery

from .engine import Lock, LockLost

__all__ = [
    "FenceField",
    "FencedModel",
    "FencedQuerySet",
    "StaleWrite",
    "UnfenceableUpdate",
    "afenced_update",
    "fence_token",
    "fenced_update",
]


class StaleWrite(LockLost):
    """A fenced ``save()`` was refused: the row carries a newer fence than ours (a newer holder
    wrote it), so our lock was lost and our write would overwrite theirs."""


class UnfenceableUpdate(TypeError):
    """A fenced update whose fence comparison Django cannot put into the statements that write
    the rows: refused before any query (never written as a read then an unfenced write)."""


class FenceField(models.BigIntegerField):  # type: ignore[type-arg]
    """The fencing token of the last accepted write of a row (0: never written fenced)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)  # forms and the admin never write a fence
        super().__init__(*args, **kwargs)


def fence_token(fence: object) -> int:
    """The token a fenced write carries: ``fence`` itself (an int >= 1) or a held ``Lock``'s.
    ``TypeError`` for what is neither a lock nor an int, ``ValueError`` for an int < 1,
    ``RuntimeError`` for a lock that is not held."""
    if isinstance(fence, Lock):
        try:
            token = fence.fence
        except RuntimeError as error:
            raise RuntimeError(
                f"a fenced write needs a held lock: {error}; acquire it first "
                f"(with redlock(...) as lock: ... save(fence=lock))"
            ) from error
        return token
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise TypeError(
            f"fence must be a held Lock or a token (a positive int from lock.fence), got "
            f"{fence!r} ({type(fence).__name__})"
        )
    if fence < 1:
        raise ValueError(
            f"fence must be a held Lock or a positive int from lock.fence, got {fence!r}"
        )
    return fence


async def afence_token(fence: object) -> int:
    """``fence_token`` in async code: a lock's token is read with ``await lock.afence()``."""
    if isinstance(fence, Lock):
        try:
            return await fence.afence()
        except RuntimeError as error:
            raise RuntimeError(f"a fenced write needs a held lock: {error}") from error
    return fence_token(fence)


def fence_field_of(model: type[models.Model]) -> str:
    """The name of ``model``'s ``FenceField`` (``"fence"`` if it has none of that type)."""
    for field in model._meta.concrete_fields:
        if isinstance(field, FenceField):
            return field.name
    return "fence"


def _fence_column(model: type[models.Model], name: str | None) -> models.Field[Any, Any]:
    """``model``'s fence field (``name``, else its ``FenceField``, else the field ``fence``), or a
    ``FieldError`` saying what a fenced write needs."""
    name = name or fence_field_of(model)
    try:
        field = model._meta.get_field(name)
    except FieldDoesNotExist:
        field = None
    if not isinstance(field, models.Field) or not field.concrete or field.is_relation:
        raise FieldError(
            f"{model._meta.label} has no fence column {name!r}: a fenced write needs a "
            f"FenceField (inherit FencedModel, or add one), a field named 'fence', or "
            f"fence_field=<the name of the column holding the token>"
        )
    return field


def _table(model: type[models.Model]) -> type[models.Model]:
    """The concrete model whose table holds ``model``'s own fields."""
    # (``None`` only for an abstract model, which has no rows to write.)
    return cast("type[models.Model]", model._meta.concrete_model)


def _pk_chain(model: type[models.Model], other: type[models.Model]) -> bool:
    """True if ``model``'s rows and ``other``'s (a parent, or ``model`` itself) share their
    primary key values: every parent link on the way is the primary key."""
    if other is _table(model):
        return True
    return all(path.join_field.primary_key for path in model._meta.get_path_to_parent(other))


def _has_joins(queryset: QuerySet[Any]) -> bool:
    """True if the queryset's own WHERE needs another table (a filter across a relation, an
    inherited field of a parent): Django's UPDATE then selects the rows in a subquery, whose
    conditions PostgreSQL does not check again on a row it had to wait for."""
    query = queryset.query.chain()
    query.get_initial_alias()
    return query.count_active_tables() > 1


def _tables(
    model: type[models.Model], changes: dict[str, Any]
) -> dict[type[models.Model], dict[str, Any]]:
    """``changes`` by the table (concrete model) that holds each field, checked by Django's own
    ``add_update_values`` (a ``FieldError`` for a field an update cannot write)."""
    UpdateQuery(model).add_update_values(changes)  # (checks only; resolved again per table)
    tables: dict[type[models.Model], dict[str, Any]] = {}
    for name, value in changes.items():
        table = _table(model._meta.get_field(name).model)
        tables.setdefault(table, {})[name] = value
    return tables


def _write(queryset: QuerySet[Any], token: int, fence_field: str | None, changes: Any) -> int:
    """The fenced update: ``changes`` and the fence written to the rows of ``queryset`` whose
    fence is not newer than ``token``, the comparison in the WHERE of each UPDATE (see
    ``fenced_update``). Returns the number of rows written."""
    model = queryset.model
    field = _fence_column(model, fence_field)
    if field.name in changes or field.attname in changes:
        raise TypeError(
            f"a fenced update writes the fence {field.name!r} itself (the token of the lock "
            f"it was given); leave it out of the changes"
        )
    if queryset.query.is_sliced:
        raise TypeError("Cannot update a query once a slice has been taken.")  # Django's words
    if queryset.query.combinator:
        raise UnfenceableUpdate(
            f"a fenced update of a combined queryset ({queryset.query.combinator}) cannot "
            f"carry its fence: filter {model._meta.label}'s rows with pk__in=<the combined "
            f"queryset>.values('pk') instead"
        )
    fenced = {f"{field.name}__lte": token}
    tables = _tables(model, changes)
    fence_table = _table(field.model)
    own = tables.pop(fence_table, {})
    own[field.name] = token
    if _table(model) is fence_table and not tables and not _has_joins(queryset):
        # One table, no join: the usual case, one ``UPDATE ... WHERE <filters> AND fence <= t``.
        return models.QuerySet.update(queryset.filter(**fenced), **own)
    for table in (fence_table, *tables):
        if not _pk_chain(model, table):
            raise UnfenceableUpdate(
                f"a fenced update of {model._meta.label} writes {table._meta.label}'s table, "
                f"linked by a parent link that is not the primary key: the fence cannot be "
                f"carried to it; update {table._meta.label} and {model._meta.label} "
                f"separately, each with fence="
            )
    # The database Django's own update() would write to (``_for_write``: the router's choice).
    using = queryset._db or router.db_for_write(model, **queryset._hints)  # type: ignore[attr-defined]
    # The rows are selected by a subquery, or by their keys read first where there are other
    # tables to write (their UPDATEs must write the same rows) or where the database cannot
    # select from the table it updates (MySQL); either way the fence comparison is in the
    # outer WHERE of the UPDATE that writes the fence, which PostgreSQL checks again on a row
    # it had to wait for.
    with transaction.atomic(using=using, savepoint=False) if tables else nullcontext():
        keys: Any = queryset.values("pk")  # (a subquery: never evaluated here)
        if tables or not connections[using].features.update_can_self_select:
            keys = list(queryset.using(using).values_list("pk", flat=True))
            if not keys:
                return 0
        rows = fence_table._base_manager.using(using).filter(pk__in=keys)
        written = models.QuerySet.update(rows.filter(**fenced), **own)
        if written and tables:
            # The other tables of the same objects, after the fence: only the rows whose fence
            # is now ours (the fenced UPDATE above holds their row locks until the commit, so
            # no other holder can change that before these statements).
            ours = rows.filter(**{field.name: token}).values("pk")
            for table, values in tables.items():
                same = table._base_manager.using(using).filter(pk__in=ours)
                models.QuerySet.update(same, **values)
    return written


def fenced_update(
    queryset: QuerySet[Any], fence: Lock | int, *, fence_field: str | None = None, **changes: Any
) -> int:
    """Write ``changes`` to the rows of ``queryset`` whose fence is not newer than the token,
    and the token to their fence: ``UPDATE ... SET <changes>, fence = t WHERE <queryset> AND
    fence <= t``. Returns the number of rows written; 0 means a holder with a newer token
    already wrote these rows (or they do not exist): this write is stale and was refused.

    The comparison is in the WHERE of the UPDATE that writes each row, whatever the queryset:
    a filter across a relation becomes ``WHERE pk IN (<the queryset>) AND fence <= t``; on a
    multi-table child, the table holding the fence is written first, ``fence <= t`` in its
    WHERE, and the other tables of the same rows after it in the same transaction, only where
    the fence is now ``t``. A shape that cannot carry it is refused before any query
    (``UnfenceableUpdate``)."""
    return _write(queryset, fence_token(fence), fence_field, changes)


async def afenced_update(
    queryset: QuerySet[Any], fence: Lock | int, *, fence_field: str | None = None, **changes: Any
) -> int:
    """The async twin of ``fenced_update``."""
    token = await afence_token(fence)  # read here: the lock's owner is this task
    from asgiref.sync import sync_to_async

    return await sync_to_async(_write)(queryset, token, fence_field, changes)


class FencedQuerySet(QuerySet[Any]):
    """``update(..., fence=lock)``: a fenced update (see ``fenced_update``); without a fence,
    Django's own."""

    def update(self, **kwargs: Any) -> int:
        field = fence_field_of(self.model)
        if field in kwargs and not isinstance(kwargs[field], models.expressions.Combinable):
            return fenced_update(self, kwargs.pop(field), fence_field=field, **kwargs)
        return super().update(**kwargs)

    async def aupdate(self, **kwargs: Any) -> int:
        field = fence_field_of(self.model)
        if field in kwargs and not isinstance(kwargs[field], models.expressions.Combinable):
            return await afenced_update(self, kwargs.pop(field), fence_field=field, **kwargs)
        return await super().aupdate(**kwargs)


class FencedModel(models.Model):
    """A model whose rows refuse stale writers: ``save(fence=lock)`` writes only if the row's
    fence is not newer than ours (in the UPDATE itself), else raises ``StaleWrite``; its queryset's
    ``update(..., fence=lock)`` writes only the rows whose fence is not newer. ``save()`` without
    a fence leaves the fence column as it is: a row's fence never goes backwards."""

    fence = FenceField()

    objects: ClassVar[models.Manager[Any]] = FencedQuerySet.as_manager()

    #: Set for the duration of a fenced save (``_do_update`` reads it).
    _writing_fence: int | None = None

    class Meta:
        abstract = True

    def save(self, *args: Any, fence: Lock | int | None = None, **kwargs: Any) -> None:
        if fence is None:
            super().save(*args, **kwargs)
        else:
            self._save_fenced(fence_token(fence), args, kwargs)

    async def asave(self, *args: Any, fence: Lock | int | None = None, **kwargs: Any) -> None:
        if fence is None:
            await super().asave(*args, **kwargs)
        else:
            token = await afence_token(fence)  # read here: the lock's owner is this task
            from asgiref.sync import sync_to_async

            await sync_to_async(self._save_fenced)(token, args, kwargs)

    def _save_fenced(self, token: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        field = fence_field_of(type(self))
        update_fields = kwargs.get("update_fields")
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, field}
        previous = getattr(self, field)
        setattr(self, field, token)
        self._writing_fence = token
        try:
            super().save(*args, **kwargs)
        except BaseException:
            setattr(self, field, previous)
            raise
        finally:
            self._writing_fence = None

    def _do_update(
        self, base_qs: QuerySet[Any], using: str | None, pk_val: Any, values: Any, *rest: Any
    ) -> Any:
        """Django's ``_do_update`` of one table of the row (a multi-table model has one per
        concrete model). In a fenced save, the UPDATE carries ``fence <= token``: in its own
        WHERE on the table that holds the fence, and through that table's row on the others
        (Django saves a multi-table model in one transaction). Without a fence, the fence
        column is not written. (``rest``: ``update_fields``, ``forced_update``, and since
        Django 6.0 ``returning_fields``.)"""
        field = _fence_column(type(self), fence_field_of(type(self)))
        fence_table = _table(field.model)
        here = _table(base_qs.model) is fence_table
        token = self._writing_fence
        if token is None or not values:
            if here:  # unfenced: a row's fence never goes backwards (nor forwards) unfenced
                values = [each for each in values if each[0].attname != field.attname]
            # Nothing to write in this table (a child that adds no fields, update_fields all
            # elsewhere): Django's own answer, with no fence to compare.
            return super()._do_update(base_qs, using, pk_val, values, *rest)
        row = base_qs.filter(pk=pk_val)
        fence_row = fence_table._base_manager.using(using).filter(pk=pk_val)
        if here:
            fenced: Any = row.filter(**{f"{field.name}__lte": token})
        else:
            newer_not = fence_row.filter(**{f"{field.name}__lte": token}).values("pk")
            fenced = row.filter(pk__in=newer_not)
        if len(rest) > 2:  # Django >= 6.0: the rows written, with their returning fields
            written = fenced._update(values, rest[2])
        else:
            written = fenced._update(values) > 0
        if not written and row.exists():
            newer = fence_row.values_list(field.name, flat=True).first()
            raise StaleWrite(
                f"{self._meta.label}:{pk_val}",
                f"{self._meta.label} {pk_val!r}: the write with fence {token} was refused: the "
                f"row carries a newer fence ({newer}), so a newer holder of the lock has "
                f"written it; ours was lost",
            )
        return written  # nothing written and no such row: Django inserts it (with our fence)


def unfenced_managers(models_: Iterable[type[models.Model]]) -> list[checks.CheckMessage]:
    """An error per ``FencedModel`` whose default manager or ``objects`` is not a fenced
    queryset's: its ``update(..., fence=)`` would be Django's own, writing an int token as the
    fence with no comparison (the manager of the first base wins: ``class Page(Document,
    FencedModel)`` gets ``Document``'s)."""
    errors: list[checks.CheckMessage] = []
    for model in models_:
        if not issubclass(model, FencedModel) or model._meta.abstract:
            continue
        managers = {model._default_manager, getattr(model, "objects", model._default_manager)}
        plain = sorted(m.name for m in managers if not isinstance(m.get_queryset(), FencedQuerySet))
        if plain:
            errors.append(
                checks.Error(
                    f"{model._meta.label}: its manager {plain[0]!r} is not a FencedQuerySet's "
                    f"(a concrete base's came first), so update(..., fence=) on it is Django's "
                    f"own update: a token is written as the fence with no comparison",
                    hint=f"name FencedModel first among {model.__name__}'s bases, or give it "
                    f"objects = FencedQuerySet.as_manager()",
                    obj=model,
                    id="django_redlock.E010",
                )
            )
    return errors


@checks.register(checks.Tags.models)
def check_fenced_managers(
    app_configs: Iterable[Any] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    return unfenced_managers(apps.get_models())
