"""Fenced writes: the protected rows themselves refuse a holder whose lock was lost.

A lock cannot stop a holder that paused past its lease (GC, SIGSTOP, a slow disk) from waking up
and writing, nor recall a query already sent when the lease ran out. The fencing token can: the
row keeps the token of the last accepted write, and a write is accepted only with a higher one,
checked by the database in the same statement (``UPDATE ... SET ..., fence = %s WHERE pk = %s
AND fence <= %s``), never read-then-write. (``<=``: a holder may write its rows twice under its
one token; any other holder's token is different, and only an older one is refused.) Tokens
come from ``lock.fence``, which strictly increases per resource across all holders.

    class Account(FencedModel):             # adds ``fence`` and a fenced queryset
        balance = models.IntegerField()

    with redlock(f"account:{pk}") as lock:
        account = Account.objects.get(pk=pk)
        account.balance += 10
        account.save(fence=lock)            # StaleWrite if a newer holder wrote the row
        Account.objects.filter(pk=pk).update(balance=F("balance") + 1, fence=lock)  # rows written

``fence=`` takes the held ``Lock`` (its ``fence`` is read) or the token itself (an int >= 1; in
async code, ``await lock.afence()``). Without ``fence=``, ``save()`` and ``update()`` are Django's
own, unfenced. A model of your own can carry a ``FenceField`` instead of inheriting
``FencedModel``, and write through ``fenced_update(queryset, lock, **changes)``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.db.models import QuerySet

from .engine import Lock, LockLost

__all__ = [
    "FenceField",
    "FencedModel",
    "FencedQuerySet",
    "StaleWrite",
    "afenced_update",
    "fence_token",
    "fenced_update",
]


class StaleWrite(LockLost):
    """A fenced ``save()`` was refused: the row carries a newer fence than ours (a newer holder
    wrote it), so our lock was lost and our write would overwrite theirs."""


class FenceField(models.BigIntegerField):  # type: ignore[type-arg]
    """The fencing token of the last accepted write of a row (0: never written fenced)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)  # forms and the admin never write a fence
        super().__init__(*args, **kwargs)


def fence_token(fence: object) -> int:
    """The token a fenced write carries: ``fence`` itself (an int >= 1) or a held ``Lock``'s.
    ``ValueError`` for anything else, ``RuntimeError`` for a lock that is not held."""
    if isinstance(fence, Lock):
        try:
            token = fence.fence
        except RuntimeError as error:
            raise RuntimeError(
                f"a fenced write needs a held lock: {error}; acquire it first "
                f"(with redlock(...) as lock: ... save(fence=lock))"
            ) from error
        return token
    if isinstance(fence, bool) or not isinstance(fence, int) or fence < 1:
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


def _fenced(queryset: QuerySet[Any], token: int, field: str) -> QuerySet[Any]:
    # ``<=``, not ``<``: the same holder may write the same rows twice under one token (tokens
    # are unique per holder); only an *older* token is refused.
    return queryset.filter(**{f"{field}__lte": token})


def fenced_update(
    queryset: QuerySet[Any], fence: Lock | int, *, fence_field: str | None = None, **changes: Any
) -> int:
    """``UPDATE ... SET <changes>, <fence field> = token WHERE <queryset> AND <fence field> <=
    token`` in one statement; returns the number of rows written. 0 means a holder with a newer
    token already wrote these rows (or they do not exist): this write is stale and was refused."""
    token = fence_token(fence)
    field = fence_field or fence_field_of(queryset.model)
    return models.QuerySet.update(_fenced(queryset, token, field), **{field: token}, **changes)


async def afenced_update(
    queryset: QuerySet[Any], fence: Lock | int, *, fence_field: str | None = None, **changes: Any
) -> int:
    """The async twin of ``fenced_update`` (``QuerySet.aupdate``)."""
    token = await afence_token(fence)
    field = fence_field or fence_field_of(queryset.model)
    fenced = _fenced(queryset, token, field)
    return await models.QuerySet.aupdate(fenced, **{field: token}, **changes)


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
    ``update(..., fence=lock)`` writes only the rows whose fence is not newer."""

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
        """Django's ``_do_update``; in a fenced save, the UPDATE carries ``fence <= token``.
        (``rest``: ``update_fields``, ``forced_update``, and since Django 6.0
        ``returning_fields``.)"""
        token = self._writing_fence
        if token is None:
            return super()._do_update(base_qs, using, pk_val, values, *rest)
        field = fence_field_of(type(self))
        row = base_qs.filter(pk=pk_val)
        fenced: Any = _fenced(row, token, field)
        if len(rest) > 2:  # Django >= 6.0: the rows written, with their returning fields
            written = fenced._update(values, rest[2])
        else:
            written = fenced._update(values) > 0
        if not written and row.exists():
            raise StaleWrite(
                f"{self._meta.label}:{pk_val}",
                f"{self._meta.label} {pk_val!r}: the write with fence {token} was refused: the "
                f"row carries a newer fence ({row.values_list(field, flat=True)[0]}), "
                f"so a newer holder of the lock has written it; ours was lost",
            )
        return written  # nothing written and no such row: Django inserts it (with our fence)
