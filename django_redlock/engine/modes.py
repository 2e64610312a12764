"""Which handle a ``lock()`` call makes: a plain lock, a semaphore's permit (``limit=N``) or a
reader (``shared=True``); the options that cannot go together are refused here, before any
network call."""

from __future__ import annotations

from .lock import Lock
from .permit_lock import PermitLock
from .permit_scripts import check_limit
from .readers import ReaderLock


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
