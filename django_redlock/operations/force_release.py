"""The admin's force release: delete exactly one holder's copies of a lock, on every master,
with the engine's compare-and-delete (a holder that took the lock since keeps it)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..engine import NodeFailure, Redlock
from ..engine.algorithm.markers import limit_of
from ..engine.base import protocol
from ..engine.base.values import FINGERPRINT_LENGTH, Owner, UnreadableValue, parse_value
from ..engine.kinds.modes import release_command
from ..engine.running.drivers import fan_out
from ..engine.scripts.permits import slot_prefix
from .inventory import INVENTORY_TIMEOUT, MARKER_BYTES, check_slot

__all__ = ["ForceRelease", "ReleaseOutcome", "check_fingerprint", "force_release"]

_FINGERPRINT = re.compile(rf"[0-9a-f]{{{FINGERPRINT_LENGTH}}}")


@dataclass(frozen=True)
class ReleaseOutcome:
    node: str
    released: bool
    detail: str  # "released", "not held by this holder", or why the master failed


@dataclass(frozen=True)
class ForceRelease:
    """What a force release did. ``owner`` is None when no master held that fingerprint: then
    nothing was sent."""

    resource: str
    fingerprint: str
    owner: Owner | None
    outcomes: tuple[ReleaseOutcome, ...]
    #: The permit released, if ``resource`` is a semaphore.
    slot: int | None = None

    @property
    def released_on(self) -> int:
        return sum(o.released for o in self.outcomes)

    @property
    def what(self) -> str:
        """The lock released, for humans: its name, or which permit of which semaphore."""
        if self.slot is None:
            return repr(self.resource)
        return f"permit {self.slot} of semaphore {self.resource!r}"

    def describe(self) -> str:
        """One line for humans and the admin log (no token in it)."""
        head = f"force release of {self.what} holder {self.fingerprint}"
        if self.owner is None:
            return f"{head}: not held by that holder on any master, nothing released"
        per_node = "; ".join(f"{o.node}: {o.detail}" for o in self.outcomes)
        return (
            f"{head} ({self.owner}): released on {self.released_on} of "
            f"{len(self.outcomes)} masters [{per_node}]"
        )


def check_fingerprint(value: object) -> str:
    if not isinstance(value, str) or not _FINGERPRINT.fullmatch(value):
        raise ValueError(
            f"fingerprint must be {FINGERPRINT_LENGTH} lowercase hex digits, got {value!r}"
        )
    return value


def force_release(
    redlock: Redlock,
    resource: str,
    fingerprint_: str,
    *,
    slot: int | None = None,
    timeout: float = INVENTORY_TIMEOUT,
) -> ForceRelease:
    """Delete the copies of ``resource`` (or of permit ``slot`` of the semaphore ``resource``)
    held by the holder with this token fingerprint, and only those: the current values are
    re-read, and the exact value whose token matches is removed with the engine's
    compare-and-delete script on every master. A new holder that took the lock since the
    fingerprint was shown keeps it."""
    protocol.check_resource(resource)
    check_fingerprint(fingerprint_)
    if slot is not None:
        check_slot(slot)
    nodes = redlock.nodes
    if slot is None:
        key = redlock.lock_key(resource)
        limit = 0
    else:
        key = f"{slot_prefix(redlock.key_prefix, redlock.spelled(resource))}{slot}"
        limit = _limit_of(fan_out(nodes, ("GET", redlock.lock_key(resource)), timeout))
    current = fan_out(nodes, ("GET", key), timeout)
    values: list[bytes] = []
    owner = None
    for reply in current:
        if isinstance(reply, bytes) and reply not in values:
            try:
                fp, found_owner = parse_value(reply)
            except UnreadableValue:
                continue  # not a lock value: never ours to delete
            if fp == fingerprint_:
                values.append(reply)
                owner = found_owner
    released = [False] * len(nodes)
    details = ["not held by this holder"] * len(nodes)
    for i, reply in enumerate(current):
        if isinstance(reply, NodeFailure):
            details[i] = f"{reply.reason}: {reply.detail}"
    for value in values:  # one, unless a foreign writer reused the token with another owner
        # The script of the mode the key belongs to: a permit wakes its semaphore's waiter, a
        # reader leaves the readers set (and may let the writer in).
        command, script = release_command(redlock, resource, value, slot=slot, limit=limit)
        replies = fan_out(nodes, command, timeout, script)
        for i, reply in enumerate(replies):
            if isinstance(reply, int) and reply >= 1:  # 1 + waiters woken; 0: not this holder
                released[i] = True
                details[i] = "released"
            elif isinstance(reply, NodeFailure) and not released[i]:
                details[i] = f"{reply.reason}: {reply.detail}"
    outcomes = tuple(
        ReleaseOutcome(node.label, released[i], details[i]) for i, node in enumerate(nodes)
    )
    return ForceRelease(resource, fingerprint_, owner, outcomes, slot)


def _limit_of(replies: list[object]) -> int:
    """The limit of the semaphore whose marker a master holds, if any does; else 0 (unknown:
    then the release wakes one waiter)."""
    for reply in replies:
        if isinstance(reply, bytes) and len(reply) < MARKER_BYTES:
            limit = limit_of(reply.decode("ascii", "replace"))
            if limit is not None:
                return limit
    return 0
