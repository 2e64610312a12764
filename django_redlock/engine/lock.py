"""A Redlock lock: acquire, extend, release; as a context manager, sync or async.

Each operation is written once, as a *procedure*: a generator that yields the I/O it needs (a
``Round`` of one request per master, or a ``Pause``) and receives the replies. ``run`` performs
those steps with blocking sockets, ``aio.arun`` with asyncio; the decisions between the steps are
the same code for both, and the decisions themselves are the pure functions of ``protocol``.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Generator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from . import protocol, scripts
from .errors import LockContended, LockLost, NodeFailure, QuorumUnavailable
from .events import notify
from .nodes import Command, Reply, fan_out
from .protocol import Tally, Vote

if TYPE_CHECKING:
    from .client import Redlock

T = TypeVar("T")

_HOST = socket.gethostname()


@dataclass(frozen=True, slots=True)
class Round:
    """Send ``commands[i]`` to master i, all at once; the answer is the list of replies."""

    commands: tuple[Command, ...]
    script: scripts.Script | None = None


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


Step = Round | Pause
Procedure = Generator[Step, Any, T]


def run(redlock: Redlock, procedure: Procedure[T]) -> T:
    """Perform a procedure's steps with blocking I/O."""
    answer: Any = None
    while True:
        try:
            step = procedure.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if isinstance(step, Round):
            answer = fan_out(redlock.nodes, step.commands, redlock.node_timeout, step.script)
        else:
            time.sleep(step.seconds)
            answer = None


def vote(reply: Reply) -> Vote:
    """SET NX answers OK or nil; our scripts answer 1 or 0."""
    if isinstance(reply, NodeFailure):
        return Vote.FAILED
    return Vote.DENIED if reply is None or reply == 0 else Vote.GRANTED


def failures(redlock: Redlock, replies: list[Reply]) -> list[NodeFailure]:
    """Per-master detail for errors: who failed and why, and who said the lock is held."""
    out = []
    for node, reply in zip(redlock.nodes, replies, strict=True):
        if isinstance(reply, NodeFailure):
            out.append(reply)
        elif vote(reply) is Vote.DENIED:
            out.append(NodeFailure(node.label, "held"))
    return out


class Lock:
    """A lease on ``resource`` over the masters of a ``Redlock``. Make one with
    ``Redlock.lock()`` (or ``django_redlock.redlock()``); one object is one lease at a time."""

    def __init__(
        self,
        redlock: Redlock,
        resource: str,
        *,
        ttl: float,
        wait: float,
        label: str | None = None,
    ) -> None:
        self._redlock = redlock
        self.resource = protocol.check_resource(resource)
        self.ttl = protocol.check_ttl(ttl)
        self.wait = protocol.check_seconds("wait", wait, allow_zero=True)
        if label is not None and not isinstance(label, str):
            raise ValueError(f"label must be a str, got {label!r}")
        self.label = label
        self.key = redlock.lock_key(resource)
        self._value: str | None = None  # token + owner, as stored on the masters, while held
        self._valid_until = 0.0  # monotonic deadline of guaranteed exclusivity
        self._acquired_at = 0.0
        self._lost = False
        self._state = threading.Lock()  # one acquisition at a time per object
        self._rng = random.Random()  # noqa: S311 (jitter only; tokens come from ``secrets``)

    def __repr__(self) -> str:
        state = "lost" if self._lost else "held" if self._value else "unlocked"
        return f"<Lock {self.resource!r} {state}>"

    # --- what the holder can ask -----------------------------------------------------------------

    @property
    def held(self) -> bool:
        """Acquired, not released, and still within validity."""
        return self._value is not None and not self._lost and self.validity > 0

    @property
    def validity(self) -> float:
        """Seconds of guaranteed exclusivity left (0.0 when not held), on the monotonic clock."""
        if self._value is None:
            return 0.0
        return max(0.0, self._valid_until - time.monotonic())

    @property
    def lost(self) -> bool:
        """True once the lease ran out, or a renewal found our token gone, while we held it."""
        if self._value is not None and not self._lost and time.monotonic() >= self._valid_until:
            self._mark_lost(self._lost_message())
        return self._lost

    def check(self) -> None:
        """Raise ``LockLost`` unless the lock is still held within its validity."""
        if self._value is None:
            raise RuntimeError(f"lock {self.resource!r} is not acquired")
        if self.lost:
            raise LockLost(self.resource, self._lost_message())

    def _mark_lost(self, message: str) -> LockLost:
        error = LockLost(self.resource, message)
        if not self._lost:
            self._lost = True
            notify(self._redlock.observer, "lost", self, error=error)
        return error

    # --- sync API --------------------------------------------------------------------------------

    def acquire(self) -> Lock:
        """Acquire the lock, trying until ``wait`` runs out; raise ``LockContended`` or
        ``QuorumUnavailable`` if it cannot."""
        self._begin()
        try:
            run(self._redlock, self._acquire())
        except BaseException:
            self._state.release()
            raise
        return self

    def extend(self) -> float:
        """Renew the lease to the full TTL on a quorum; returns the new validity in seconds.

        Raises ``LockLost`` when the lease cannot be renewed before it runs out."""
        return run(self._redlock, self._extend())

    def release(self) -> None:
        """Delete our key on every master (compare-and-delete: never another owner's)."""
        try:
            run(self._redlock, self._release())
        finally:
            self._end()

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lost = self.lost
        self.release()
        self._raise_if_lost(lost, exc)

    # --- async API (same procedures, performed by aio.arun) ------------------------------------

    async def aacquire(self) -> Lock:
        from .aio import arun

        self._begin()
        try:
            await arun(self._redlock, self._acquire())
        except BaseException:
            self._state.release()
            raise
        return self

    async def aextend(self) -> float:
        from .aio import arun

        return await arun(self._redlock, self._extend())

    async def arelease(self) -> None:
        from .aio import arun

        try:
            await arun(self._redlock, self._release())
        finally:
            self._end()

    async def __aenter__(self) -> Lock:
        return await self.aacquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lost = self.lost
        await self.arelease()
        self._raise_if_lost(lost, exc)

    # --- the procedures --------------------------------------------------------------------------

    def _acquire(self) -> Procedure[None]:
        redlock = self._redlock
        began = time.monotonic()
        deadline = began + self.wait
        ttl_ms = int(self.ttl * 1000)
        attempts = 0
        while True:
            attempts += 1
            value = self._new_value()
            start = time.monotonic()
            replies: list[Reply] = yield Round(
                tuple(("SET", self.key, value, "NX", "PX", ttl_ms) for _ in redlock.nodes)
            )
            result = self._tally(replies, start)
            if result.won:
                self._value = value
                self._valid_until = (
                    start + self.ttl - protocol.drift(self.ttl, redlock.drift_factor)
                )
                self._lost = False
                self._acquired_at = time.monotonic()
                waited = self._acquired_at - began
                notify(redlock.observer, "acquired", self, waited=waited, attempts=attempts)
                return
            if result.granted or result.failed:
                # Undo partial success everywhere, failed masters included: a SET that timed out
                # may still have landed, and would otherwise block others until its TTL.
                yield self._release_round(value)
            delay = protocol.retry_delay(redlock.retry_delay, self._rng)
            if time.monotonic() + delay > deadline:
                error = self._not_acquired(result, replies, attempts)
                waited = time.monotonic() - began
                notify(redlock.observer, "not_acquired", self, waited=waited, error=error)
                raise error
            yield Pause(delay)

    def _extend(self) -> Procedure[float]:
        if self._value is None:
            raise RuntimeError(f"cannot extend lock {self.resource!r}: it is not acquired")
        redlock = self._redlock
        value = self._value
        ttl_ms = int(self.ttl * 1000)
        while True:
            start = time.monotonic()
            if self.lost:
                raise LockLost(self.resource, self._lost_message())
            replies: list[Reply] = yield Round(
                tuple(scripts.EXTEND.evalsha((self.key,), (value, ttl_ms)) for _ in redlock.nodes),
                scripts.EXTEND,
            )
            result = self._tally(replies, start)
            # Counts only if a quorum renewed it *before* the old lease ran out: after that,
            # someone else may have held the lock in between, and renewing would hide it.
            if result.won and time.monotonic() < self._valid_until:
                self._valid_until = (
                    start + self.ttl - protocol.drift(self.ttl, redlock.drift_factor)
                )
                return self._valid_until - time.monotonic()
            if result.lost:
                raise self._mark_lost(
                    f"lock {self.resource!r} is gone from {result.denied} of {result.total} "
                    f"masters: it expired or was released by force"
                )
            delay = protocol.retry_delay(redlock.retry_delay, self._rng)
            if time.monotonic() + delay >= self._valid_until:
                raise self._mark_lost(
                    f"could not renew lock {self.resource!r} on a quorum before its lease ran "
                    f"out: " + "; ".join(str(f) for f in failures(redlock, replies))
                )
            yield Pause(delay)

    def _release(self) -> Procedure[None]:
        if self._value is None:
            raise RuntimeError(f"cannot release lock {self.resource!r}: it is not acquired")
        yield self._release_round(self._value)
        notify(self._redlock.observer, "released", self, held=time.monotonic() - self._acquired_at)

    def _release_round(self, value: str) -> Round:
        return Round(
            tuple(scripts.RELEASE.evalsha((self.key,), (value,)) for _ in self._redlock.nodes),
            scripts.RELEASE,
        )

    # --- helpers ---------------------------------------------------------------------------------

    def _begin(self) -> None:
        if not self._state.acquire(blocking=False):
            raise RuntimeError(
                f"lock {self.resource!r} is already acquired by this object; "
                f"use one Lock object per holder"
            )

    def _end(self) -> None:
        if self._value is not None:
            self._value = None
            self._state.release()

    def _new_value(self) -> str:
        """What we store on each master: an unguessable token, then who we are (for humans)."""
        owner = {
            "host": _HOST,
            "pid": os.getpid(),
            "thread": threading.current_thread().name,
            "label": self.label,
            "since": round(time.time(), 3),  # wall clock, for display only
            "ttl": self.ttl,
        }
        return f"{secrets.token_hex(16)}:{json.dumps(owner, separators=(',', ':'))}"

    def _tally(self, replies: list[Reply], start: float) -> Tally:
        return protocol.tally(
            [vote(r) for r in replies],
            ttl=self.ttl,
            elapsed=time.monotonic() - start,
            drift_factor=self._redlock.drift_factor,
        )

    def _not_acquired(
        self, result: Tally, replies: list[Reply], attempts: int
    ) -> LockContended | QuorumUnavailable:
        detail = failures(self._redlock, replies)
        tries = f"{attempts} attempt{'s' if attempts > 1 else ''}"
        if result.granted >= result.quorum:
            return QuorumUnavailable(
                self.resource,
                f"lock {self.resource!r}: masters answered too late, no validity left of "
                f"ttl={self.ttl}s ({tries})",
                detail,
                attempts=attempts,
            )
        if result.contended:
            return LockContended(
                self.resource,
                f"lock {self.resource!r} is held by another owner ({tries}, wait={self.wait}s)",
                detail,
                attempts=attempts,
            )
        return QuorumUnavailable(
            self.resource,
            f"lock {self.resource!r}: only {result.granted + result.denied} of {result.total} "
            f"masters answered, {result.quorum} needed ({tries})",
            detail,
            attempts=attempts,
        )

    def _lost_message(self) -> str:
        return (
            f"lock {self.resource!r} was lost: its lease (ttl={self.ttl}s) ran out or was not "
            f"renewed in time; another owner may have held it since"
        )

    def _raise_if_lost(self, lost: bool, exc: BaseException | None) -> None:
        if not lost:
            return
        message = self._lost_message()
        if exc is not None:
            # Do not mask the block's own error; say on it that exclusivity was also lost.
            exc.add_note(message)
            return
        raise LockLost(self.resource, message)
