"""Readers of a readers/writer lock: ``lock(name, shared=True)``. Readers share; the writer is the
plain lock on the same name (``lock(name)``), which excludes readers and writers alike.

Why the majority quorum is safe here (unlike a semaphore's counters, see ``permits``): a reader
holds on a majority and a writer needs a majority, and two majorities share a master. On that
master the reader's script refuses while a writer's value holds the name, and the writer's SET NX
fails while the ``readers`` marker does (its TTL outlives every reader's there, renewals push it).

Each reader is an ordinary lease: a key of its own (``<name>@reader:<id>``) with its token and
TTL, so extend, auto-extend, ``owned()``, lost notices and validity are the lock's. No writer
starvation: a writer that waits queues on the name's waiter queue, and a reader refuses to enter
while a live writer is queued; the last reader out wakes it, and so does a reader refused for it
while the name is free (a release woke that reader, queued ahead of it). Readers that queued
behind a writer are woken together when it releases (the first wakes the next).
"""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..algorithm.markers import described
from ..algorithm.procedures import JITTER, Granted, Lost, Want, Won, tally, wait_turn
from ..algorithm.refusals import not_acquired
from ..algorithm.steps import AwaitTurn, Listen, Masters, Pause, Procedure, Round, failures
from ..base import protocol
from ..base.errors import LockContended
from ..handles.granting import granted
from ..leases.leases import Lease, Owner
from ..members.rounds import Reply
from ..scripts.readers import READER_ACQUIRE, READER_EXTEND, READER_RELEASE
from ..waiting.local_queues import Turn
from ..waiting.waiter import Waiter
from .group import GroupLock

if TYPE_CHECKING:
    from ..handles.fields import Engine


@dataclass(frozen=True, slots=True)
class ReaderKeys:
    """A reader's keys (see ``reader_scripts``) and how its release notices are addressed."""

    reader: str
    name: str  # the plain lock key
    queue: str
    readers: str
    queued_readers: str
    inbox_prefix: str

    def acquire(self, value: str, ttl_ms: int, waiter: str, wait_ms: int) -> Round:
        keys = (self.reader, self.name, self.queue, self.readers, self.queued_readers)
        # One notice per attempt, not per reader: a writer told twice (two refused attempts of
        # one reader, see ``READER_ACQUIRE``) hears the second too (``notice_reading.deliver``
        # acts once per notice). (A counter: formatting a clock's float cost twice as much.)
        digest = protocol.notice_digest(f"{value}@{next(_ATTEMPTS)}")
        args = (value, ttl_ms, waiter, wait_ms, digest, self.inbox_prefix)
        return Round(READER_ACQUIRE.evalsha(keys, args), READER_ACQUIRE)

    def extend(self, lease: Lease, ttl_ms: int) -> Round:
        keys = (self.reader, self.name, self.readers)
        return Round(READER_EXTEND.evalsha(keys, (lease.value, ttl_ms)), READER_EXTEND)

    def release(self, lease: Lease, *, cleanup: bool = False) -> Round:
        return self.release_value(lease.value, queued_as=lease.queued_as, cleanup=cleanup)

    def release_value(
        self, value: str, *, notify: bool = True, queued_as: str = "", cleanup: bool = False
    ) -> Round:
        keys = (self.reader, self.name, self.queue, self.readers, self.queued_readers)
        digest = protocol.notice_digest(value)
        args = (value, "1" if notify else "", queued_as, "", digest, self.inbox_prefix)
        return Round(READER_RELEASE.evalsha(keys, args), READER_RELEASE, cleanup)


#: Numbers a reader's attempts (see ``ReaderKeys.acquire``).
_ATTEMPTS = itertools.count()


def reader_keys(redlock: Engine, name: str, reader_key: str) -> ReaderKeys:
    """The keys of the reader ``reader_key`` of the readers/writer lock ``name``."""
    return ReaderKeys(
        reader=reader_key,
        name=redlock.lock_key(name),
        queue=redlock.queue_key(name),
        readers=redlock.key("readers", name),
        queued_readers=redlock.key("readwait", name),
        inbox_prefix=redlock.inbox_prefix,
    )


@dataclass(slots=True)  # (as Want: not frozen)
class ReaderWant(Want):
    keys_of: ReaderKeys | None = None


def attempt(
    masters: Masters, want: ReaderWant, waiter: Waiter | None, deadline: float
) -> Procedure[Granted | Lost]:
    """The lock's five steps (``procedures.attempt``) with the reader's script."""
    assert want.keys_of is not None  # noqa: S101 (the handle always sets it)
    start = time.monotonic()
    wait_ms = 0 if waiter is None else max(int((deadline - start) * 1000), 1)
    request = want.keys_of.acquire(
        want.value, int(want.ttl * 1000), "" if waiter is None else waiter.id, wait_ms
    )
    undo = want.keys_of.release_value(want.value, notify=False)
    try:
        replies: list[Reply] = yield request
    except BaseException:
        yield Round(undo.command, undo.script, cleanup=True)
        raise
    result = tally(masters, replies, want.ttl, start)
    if result.won:
        valid_until = start + want.ttl - protocol.drift(want.ttl, masters.drift_factor)
        return Granted(valid_until, failures(masters, replies) if result.failed else [])
    if result.granted or result.failed:
        # Quietly, unless we may have been the last reader somewhere: then wake who waits.
        yield want.keys_of.release_value(want.value, notify=True)
    return Lost(result, replies)


def acquire(masters: Masters, want: ReaderWant) -> Procedure[Won]:
    """A reader's acquisition: like ``procedures.acquire`` (local queue, then a queued waiter
    woken by notices, by the writer's expiry, or the safety poll)."""
    assert want.keys_of is not None  # noqa: S101
    began = time.monotonic()
    deadline = began + want.wait
    attempts = 0
    turn: Turn | None = None
    waiter: Waiter | None = None
    lost: Lost | None = None
    try:
        if want.wait > 0:
            turn = masters.queues.join((f"{want.resource} (readers)",))
        while True:
            if turn is not None:
                first = yield AwaitTurn(turn, deadline - time.monotonic())
                if not first:
                    raise reader_not_acquired(masters, want, lost, attempts)
                if waiter is None and lost is not None:
                    waiter = yield Listen()
            attempts += 1
            outcome = yield from attempt(masters, want, waiter, deadline)
            if isinstance(outcome, Granted):
                queued_as = "" if waiter is None else waiter.id
                return Won(outcome.valid_until, attempts, began, queued_as, outcome.failures)
            lost = outcome
            for reply in lost.replies:
                if isinstance(reply, list) and reply and reply[0] == -1:
                    raise mismatch_error(want, reply[1], lost, masters, attempts)
            now = time.monotonic()
            if now >= deadline:
                raise reader_not_acquired(masters, want, lost, attempts)
            if lost.result.contended and waiter is None:
                continue  # become a waiter, then try again: that try queues it
            if lost.result.contended and waiter is not None:
                yield from wait_turn(masters, waiter, lost, deadline)
                continue
            delay = protocol.retry_delay(masters.retry_delay, JITTER)
            if now + delay > deadline:
                raise not_acquired(masters, want, lost, attempts)
            yield Pause(delay)
    except BaseException as exc:
        if waiter is not None and not isinstance(exc, GeneratorExit | LockContended):
            yield Round(("ZREM", want.keys_of.queue, waiter.id), cleanup=True)
            yield Round(("SREM", want.keys_of.queued_readers, waiter.id), cleanup=True)
        raise
    finally:
        if turn is not None:
            masters.queues.leave(turn)


def reader_not_acquired(
    masters: Masters, want: Want, lost: Lost | None, attempts: int
) -> Exception:
    held = (
        f"lock {want.resource!r} is held by a writer, or a writer waits for it (readers let a "
        f"waiting writer go first)"
    )
    return not_acquired(masters, want, lost, attempts, contended=held)


def mismatch_error(
    want: Want, found: object, lost: Lost, masters: Masters, attempts: int
) -> LockContended:
    text = found.decode(errors="replace") if isinstance(found, bytes) else str(found)
    return LockContended(
        want.resource,
        f"{want.resource!r} is asked for by a reader (shared=True) and is held as "
        f"{described(text) or repr(text)}: one resource must be used one way",
        failures(masters, lost.replies),
        attempts=attempts,
    )


class ReaderLock(GroupLock):
    """A reader of the readers/writer lock ``resource`` (``Redlock.lock(name, shared=True)``):
    a ``Lock`` whose lease is a reader key of its own."""

    holder = "reader"
    second = "is a second reader"
    group = "a readers/writer lock"
    key_suffix = "@readers"

    def __init__(self, redlock: Engine, *resources: str, **options: Any) -> None:
        super().__init__(redlock, *resources, option="shared=True", **options)

    def __repr__(self) -> str:
        return super().__repr__().replace("<Lock", "<Reader", 1)

    def _keys(self) -> ReaderKeys:
        name = self.resource
        return reader_keys(
            self._redlock, name, self._redlock.key("lock", name, f"@reader:{secrets.token_hex(6)}")
        )

    def _want(self, owner: Owner) -> ReaderWant:
        return self._want_of(owner, ReaderWant, keys_of=self._keys())

    def _acquiring(self, want: Want) -> Procedure[Won]:
        assert isinstance(want, ReaderWant)  # noqa: S101 (our own _want made it)
        return acquire(self._redlock, want)

    def _lease(self, owner: Owner, want: Want, won: Won) -> Lease:
        assert isinstance(want, ReaderWant)  # noqa: S101
        assert want.keys_of is not None  # noqa: S101
        keys = (want.keys_of.reader,)
        return granted(self, owner, want.value, won, keys, want.keys_of, parts=want.parts)
