"""Typed errors. Each one names the resource and, where masters were asked, what each one said."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeFailure:
    """Why one master did not grant a request: ``"held"`` (another owner), ``"gone"`` (our
    token is not there any more), ``"timeout"`` or ``"error"``; within the engine also
    ``"unawaited"``: a reply the round did not wait for, a quorum having decided it (never
    reported as a failure). ``node`` is the master's
    address with any password masked."""

    node: str
    reason: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.node}: {self.reason}" + (f" ({self.detail})" if self.detail else "")


def error_detail(exc: BaseException) -> str:
    """What a master's error reply says, and for one that cannot run Lua scripts (a Valkey
    whose ``lua`` module was unloaded, a server without ``EVAL``) what that means: every lock
    command but the grant is a script."""
    text = f"{type(exc).__name__}: {exc}"
    if lacks_scripting(exc) is not None:
        text += (
            "; this master cannot run Lua scripts, so it can neither release nor extend a lock: "
            "load its scripting engine (Valkey: the lua module) or list another master"
        )
    return text


def lacks_scripting(reply: object) -> str | None:
    """The server's words if ``reply`` (an error reply) says it cannot run Lua scripts: its
    scripting engine is gone (Valkey: "Could not find scripting engine 'lua'"), or ``EVAL`` or
    ``EVALSHA`` is (renamed away); else None (an answer, or another error: ``SCRIPT`` renamed
    away alone, say, which our scripts do not need)."""
    if not isinstance(reply, Exception):
        return None
    text = str(reply)
    lowered = text.lower()
    if "scripting engine" in lowered or "unknown command 'eval" in lowered:
        return text
    return None


#: The reason of a reply the round did not wait for (``unawaited.unawaited``): no failure of its
#: master.
UNAWAITED = "unawaited"


@functools.lru_cache(maxsize=256)  # one per master (immutable), not one per reply unawaited
def unawaited_failure(node: str) -> NodeFailure:
    return NodeFailure(node, UNAWAITED, "the round was decided before it answered")


class RedlockError(Exception):
    """Base of every error this library raises on purpose."""


class LockNotAcquired(RedlockError):
    """The lock could not be acquired within ``wait``. See the two subclasses."""

    def __init__(
        self,
        resource: str,
        message: str,
        failures: Sequence[NodeFailure] = (),
        *,
        attempts: int = 1,
        retry_after: float | None = None,
    ) -> None:
        self.resource = resource
        self.failures = tuple(failures)
        self.attempts = attempts
        #: A hint, in seconds, of when trying again may succeed, for ``Retry-After`` headers.
        #: The engine itself leaves it None: a refused SET NX does not say how long the holder's
        #: key has left, and that would be a poor guess anyway for an auto-extended lease, which
        #: lasts as long as its holder runs (``lock_view`` then uses its own defaults).
        self.retry_after = retry_after
        detail = "; ".join(str(f) for f in self.failures)
        super().__init__(f"{message} [{detail}]" if detail else message)


class LockContended(LockNotAcquired):
    """Another owner holds the lock on enough masters that we could not reach a quorum."""


class QuorumUnavailable(LockNotAcquired):
    """Too many masters failed (down, paused, slower than NODE_TIMEOUT) to reach a quorum, or the
    masters answered so late that no validity time was left."""


class Overloaded(LockNotAcquired):
    """This process asks faster than its rounds can be answered: the caller's turn in the local
    queue of rounds (``queued`` ahead of it) would not come within its patience (its ``wait``,
    or ``admission.PATIENCE`` for a single attempt). The masters were not asked, and are not to
    blame: slow down, or spread the load over more processes."""

    def __init__(
        self,
        resource: str,
        message: str,
        *,
        queued: int,
        waited: float,
        attempts: int = 1,
    ) -> None:
        super().__init__(resource, message, attempts=attempts)
        self.queued = queued
        self.waited = waited


class LockLost(RedlockError):
    """The lease ran out or the masters no longer hold our token: exclusivity may have been
    broken. Raised on leaving the ``with`` block, by ``release()`` when no quorum confirmed
    removing our lease, by ``extend()`` and by ``check()``. ``failures``: per master, what it
    said (``"gone"``: our token was not there any more; ``"timeout"``/``"error"``)."""

    def __init__(
        self,
        resource: str,
        message: str,
        failures: Sequence[NodeFailure] = (),
        *,
        unconfirmed: bool = False,
    ) -> None:
        self.resource = resource
        self.failures = tuple(failures)
        #: Raised by a release that too few masters answered, of a lease still valid: nothing
        #: says it was lost (exclusivity held until the release), but nothing confirmed that it
        #: was removed either; where it remains, it expires within its TTL.
        self.unconfirmed = unconfirmed
        detail = "; ".join(str(f) for f in self.failures)
        super().__init__(f"{message} [{detail}]" if detail else message)


class ExtensionLimit(RedlockError):
    """``extend()`` was refused: the lease was extended ``max_extensions`` times already."""

    def __init__(self, resource: str, message: str) -> None:
        self.resource = resource
        super().__init__(message)


class NotLocked(RedlockError):
    """``assert_locked()``: the calling thread or task does not hold the lock (code that must
    only ever run guarded was called unguarded)."""

    def __init__(self, resource: str, message: str) -> None:
        self.resource = resource
        super().__init__(message)
