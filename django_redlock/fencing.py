"""Fenced writes: let the protected resource reject a holder whose lock was lost.

A lock cannot stop a holder that paused past its lease (GC, SIGSTOP, a slow disk) from waking up
and writing. The fencing token can: store the token of the last accepted write next to the data,
and accept a write only with a higher token. Tokens come from ``lock.fence``, which strictly
increases per resource across all holders.

    with redlock(f"account:{pk}") as lock:
        ...
        if not fenced_update(Account.objects.filter(pk=pk), lock.fence, balance=new_balance):
            raise LockLost(...)  # a newer holder has written: ours is stale
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet


def fenced_update(
    queryset: QuerySet[Any], token: int, *, fence_field: str = "fence", **changes: Any
) -> int:
    """``UPDATE ... SET <changes>, <fence_field> = token WHERE <queryset> AND <fence_field> <
    token`` in one statement; returns the number of rows written. 0 means a holder with a newer
    token already wrote these rows (or they do not exist): this write is stale and was rejected."""
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise ValueError(f"token must be a positive int from lock.fence, got {token!r}")
    stale = {f"{fence_field}__lt": token}
    return queryset.filter(**stale).update(**{fence_field: token}, **changes)


async def afenced_update(
    queryset: QuerySet[Any], token: int, *, fence_field: str = "fence", **changes: Any
) -> int:
    """The async twin of ``fenced_update`` (``QuerySet.aupdate``)."""
    if isinstance(token, bool) or not isinstance(token, int) or token < 1:
        raise ValueError(f"token must be a positive int from lock.fence, got {token!r}")
    stale = {f"{fence_field}__lt": token}
    return await queryset.filter(**stale).aupdate(**{fence_field: token}, **changes)
