"""Which handle a ``lock()`` call makes: a plain lock, a semaphore's permit (``limit=N``) or a
reader (``shared=True``); the options that cannot go together are refused here, before any
network call."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import markers
from .lock import Lock
from .packing import Command
from .permit_lock import PermitLock
from .permit_scripts import check_limit
from .permits import release_slot
from .readers import ReaderLock, reader_keys
from .scripts import Script

if TYPE_CHECKING:
    from .redlock import Redlock

_READER = re.compile(r"(.+)@reader:[0-9a-f]{12}")
_SLOT = re.compile(r"(.+)#(\d+)")


def member_of(resource: str, marker: str | None) -> tuple[str, str, int | None]:
    """Whether ``resource`` is a reader's key or a semaphore's slot (``marker``: what its base
    name's plain lock key holds, if known): (mode "reader"/"permit"/"lock", group, limit)."""
    reader = _READER.fullmatch(resource)
    if reader is not None:
        return "reader", reader[1], None
    slot = _SLOT.fullmatch(resource)
    if slot is not None and marker is not None:
        limit = markers.limit_of(marker)
        if limit is not None and int(slot[2]) < limit:
            return "permit", slot[1], limit
    return "lock", "", None


def release_command(
    redlock: Redlock, resource: str, value: str | bytes, marker: str | None
) -> tuple[Command, Script]:
    """The compare-and-delete of exactly ``value`` under ``resource``, with the script of the
    mode the key belongs to (a reader leaves the readers set and may let the writer in; a permit
    wakes its semaphore's queue), for the admin's force release of one holder."""
    mode, group, _ = member_of(resource, marker)
    text = value.decode() if isinstance(value, bytes) else value
    if mode == "reader":
        keys = reader_keys(redlock, group, redlock.lock_key(resource))
        round_ = keys.release_value(text)
    elif mode == "permit":
        slot_key, queue = redlock.lock_key(resource), redlock.queue_key(group)
        round_ = release_slot(redlock.inbox_prefix, slot_key, queue, text)
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
