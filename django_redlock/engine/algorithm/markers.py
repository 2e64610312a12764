"""The markers a mode leaves under a name's plain lock key while it is held (``semaphore:<N>``
for a semaphore, ``readers`` for readers): a plain lock's SET NX finds the key and cannot be taken
beside them, and a caller with another idea of the resource is told what holds it instead.

``permits:<N>`` is an earlier version's semaphore, whose permits were kept under the name's own
lock keys (``lock:<name>#<i>``; now ``permit_scripts.slot_prefix``). Its marker is not ours, so
that during a rolling upgrade the two versions refuse each other's semaphore instead of both
granting N permits of one name (each master holds one version's marker at a time, and it outlives
every permit there)."""

from __future__ import annotations

import re

from ..base.errors import LockContended
from ..members.interface import Reply
from .steps import Procedure, Round

READERS = "readers"
_PERMITS = re.compile(r"semaphore:(\d+)|permits:(\d+)")  # (ours | an earlier version's)


def permits(limit: int) -> str:
    return f"semaphore:{limit}"


def limit_of(value: str) -> int | None:
    """A semaphore marker's limit (ours or an earlier version's); None for anything else."""
    match = _PERMITS.fullmatch(value)
    return None if match is None else int(match[1] or match[2])


def is_marker(value: str) -> bool:
    return value == READERS or _PERMITS.fullmatch(value) is not None


def described(value: str) -> str | None:
    """What a marker (or a mode's name for what it found: ``lock``) means, for messages; None if
    ``value`` is no marker."""
    if value == "lock":
        return "a plain lock (no limit, not shared)"
    if value == READERS:
        return "a readers/writer lock's readers (shared=True)"
    match = _PERMITS.fullmatch(value)
    if match is None:
        return None
    if match[2] is not None:
        return (
            f"a semaphore with limit={match[2]} of an earlier version of django-redlock (its "
            f"permits are kept elsewhere: upgrade every process that uses it)"
        )
    return f"a semaphore with limit={match[1]}"


def explain(lock_key: str, error: LockContended) -> Procedure[LockContended]:
    """A plain lock refused: if a mode's marker holds its key, say so (one GET round, only after
    a refusal), instead of 'held by another owner'."""
    replies: list[Reply] = yield Round(("GET", lock_key))
    for reply in replies:
        found = reply.decode(errors="replace") if isinstance(reply, bytes) else "lock"
        if found == READERS:  # the plain lock is the writer: readers hold it, that is all
            return LockContended(
                error.resource,
                f"lock {error.resource!r} is held by readers (shared=True); the writer waits "
                f"for the last of them",
                error.failures,
                attempts=error.attempts,
            )
        what = None if found == "lock" else described(found)
        if what is not None:
            return LockContended(
                error.resource,
                f"lock {error.resource!r} is held as {what}, and was asked for as a plain lock: "
                f"one resource must be used one way",
                error.failures,
                attempts=error.attempts,
            )
    return error
