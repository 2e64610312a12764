"""Which handle a ``lock()`` call makes: a plain lock, a semaphore's permit (``limit=N``) or a
reader (``shared=True``); the options that cannot go together are refused here, before any
network call."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..algorithm.permits import release_slot
from ..algorithm.steps import Procedure, Round
from ..members.packing import Command
from ..scripts.permits import check_limit, slot_prefix
from ..scripts.plain import Script
from .lock import Lock
from .permit import PermitLock
from .readers import ReaderLock, reader_keys

if TYPE_CHECKING:
    from ..handles.fields import Engine

_READER = re.compile(r"(.+)@reader:[0-9a-f]{12}")


def reader_of(resource: str) -> str | None:
    """The readers/writer lock whose reader's key ``resource`` is (``name@reader:<id>``), if it
    is one. (A semaphore's permits need no such guess: their keys are a kind of their own,
    ``permit_scripts.slot_prefix``.)"""
    reader = _READER.fullmatch(resource)
    return None if reader is None else reader[1]


def member_keys(
    redlock: Engine, name: str, limit: int | None
) -> Procedure[tuple[list[str], list[str]]]:
    """The holders of the semaphore ``name`` with ``limit`` permits, or of the readers/writer
    lock ``name`` (``limit`` None): how each is shown (a permit as ``<name>#<slot>``, a reader
    by its key's name), and its key. Readers: one round, for the readers set on every master."""
    if limit is not None:
        spelled = redlock.spelled(name)  # (with a Cluster member, hash-tagged: ``keyspace``)
        slots = slot_prefix(redlock.key_prefix, spelled)
        return [f"{spelled}#{i}" for i in range(limit)], [f"{slots}{i}" for i in range(limit)]
    listed = yield Round(("ZRANGE", redlock.key("readers", name), 0, -1))
    keys = sorted({k.decode() for r in listed if isinstance(r, list) for k in r})
    return [k.removeprefix(redlock.lock_prefix) for k in keys], keys


def release_command(
    redlock: Engine, resource: str, value: str | bytes, *, slot: int | None = None, limit: int = 0
) -> tuple[Command, Script]:
    """The compare-and-delete of exactly ``value`` under ``resource``, or under its permit
    ``slot`` if it is a semaphore (``limit``: its N, 0 if unknown), with the script of the mode
    the key belongs to (a reader leaves the readers set and may let the writer in; a permit
    wakes its semaphore's queue), for the admin's force release of one holder."""
    text = value.decode() if isinstance(value, bytes) else value
    group = reader_of(resource)
    if slot is not None:
        slots = slot_prefix(redlock.key_prefix, redlock.spelled(resource))
        round_ = release_slot(
            redlock.inbox_prefix,
            f"{slots}{slot}",
            redlock.queue_key(resource),
            text,
            slot_prefix=slots,
            limit=limit,
        )
    elif group is not None:
        keys = reader_keys(redlock, group, redlock.lock_key(resource))
        round_ = keys.release_value(text)
    else:
        return redlock.release_command((resource,), value)
    assert round_.script is not None  # noqa: S101 (both are scripts)
    return round_.command, round_.script


def check_mode(limit: object, shared: object, reentrant: object) -> type[Lock]:
    if not isinstance(shared, bool):
        raise ValueError(f"shared must be True or False, got {shared!r}")
    if limit is None:
        if shared and reentrant:
            raise ValueError(
                "shared=True with reentrant=True: a reader is not re-entered (a second "
                "acquisition is a second reader); pass one or the other"
            )
        return ReaderLock if shared else Lock
    checked = check_limit(limit)
    if shared:
        raise ValueError(
            f"limit={checked} with shared=True: a semaphore's permits are all alike, and a "
            f"readers/writer lock has no limit; pass one or the other"
        )
    if reentrant:
        raise ValueError(
            f"limit={checked} with reentrant=True: a permit is not re-entered (a second "
            f"acquisition takes a second permit); pass one or the other"
        )
    return PermitLock
