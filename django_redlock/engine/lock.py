"""A Redlock lock: acquire, extend, release, fence; as a context manager, sync or async.

Each operation is written once, as a *procedure*: a generator that yields the I/O it needs (a
``Round`` of one request per master, a ``Pause``, or waiting for a release notice) and receives
the answers. ``run`` performs those steps with blocking sockets, ``aio.arun`` with asyncio; the
decisions between the steps are the same code for both, and the decisions themselves are the pure
functions of ``protocol``.

A ``Lock`` is the handle a user holds; what it holds once acquired is a ``Lease`` (the token on the
masters, its validity deadline, its fence). Re-entrant handles share their owner's lease, and the
auto-extend watchdog renews leases, not handles.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from . import protocol, scripts
from .errors import LockContended, LockLost, LockNotAcquired, NodeFailure, QuorumUnavailable
from .events import notify
from .nodes import Command, Reply, fan_out
from .notices import Waiter
from .protocol import Tally, Vote

if TYPE_CHECKING:
    from .client import Redlock

T = TypeVar("T")

_HOST = socket.gethostname()

#: Jitter for retries and hand-offs (one per process: seeding one per lock cost ~8 us and ~3 KB).
#: Tokens never come from here but from ``secrets``.
_JITTER = random.Random()  # noqa: S311
# Forked children must not all draw the same "random" delays as their parent and each other.
os.register_at_fork(after_in_child=_JITTER.seed)

#: The owner part of lock values, by (process, thread, label, ttl): JSON-encoding it on every
#: acquisition cost more than the rest of building the value (``with redlock(r):`` makes a new
#: Lock each time, so a per-Lock cache did not help there).
_OWNER_JSON: dict[tuple[int, int, str | None, float], str] = {}

#: A process that released a lock other processes were waiting for stays out of the next round
#: for this long, so that the waiter it woke gets the lock instead of the releaser barging back in.
COURTESY = 0.003


# --- the steps a procedure can ask for ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Round:
    """Send ``command`` to every master at once; the answer is the list of their replies."""

    command: Command
    script: scripts.Script | None = None
    #: Clean-up after an interruption: the async runner shields it from a second cancellation.
    cleanup: bool = False


@dataclass(frozen=True, slots=True)
class Pause:
    seconds: float


@dataclass(frozen=True, slots=True)
class Listen:
    """Become a waiter that releases can wake by name; the answer is a ``Waiter``, returned once
    a quorum of masters confirmed our inbox subscription (or after one NODE_TIMEOUT)."""


@dataclass(frozen=True, slots=True)
class AwaitNotice:
    """Sleep until a release wakes ``waiter``, or ``timeout``; answers True if one did. The
    beacon is re-armed."""

    waiter: Waiter
    timeout: float


Step = Round | Pause | Listen | AwaitNotice
Procedure = Generator[Step, Any, T]


def run(redlock: Redlock, procedure: Procedure[T]) -> T:
    """Perform a procedure's steps with blocking I/O.

    If a step is interrupted (KeyboardInterrupt, an error), the exception is thrown into the
    procedure, which may yield clean-up steps (undo a half-done acquisition) before it re-raises.
    """
    answer: Any = None
    error: BaseException | None = None
    waiters: list[Waiter] = []
    try:
        while True:
            try:
                step = procedure.throw(error) if error else procedure.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            error = None
            try:
                answer = _perform(redlock, step, waiters)
            except BaseException as exc:  # noqa: BLE001 (handed to the procedure, re-raised there)
                error = exc
    finally:
        for waiter in waiters:
            redlock.notices.unlisten(waiter)


def _perform(redlock: Redlock, step: Step, waiters: list[Waiter]) -> Any:
    if isinstance(step, Round):
        return fan_out(redlock.nodes, step.command, redlock.node_timeout, step.script)
    if isinstance(step, Pause):
        time.sleep(step.seconds)
        return None
    if isinstance(step, Listen):
        waiter = redlock.notices.listen()
        waiters.append(waiter)
        waiter.subscribed.wait(redlock.node_timeout)
        return waiter
    notified = step.waiter.notified.wait(step.timeout)
    step.waiter.notified.clear()
    return notified


def vote(reply: Reply) -> Vote:
    """SET NX answers OK or nil; our scripts answer 0 for 'not ours' and >= 1 for done."""
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


def current_owner() -> tuple[int, int, int]:
    """Who is acting: (process, thread, asyncio task or 0). Re-entry and release are allowed to
    the owner that acquired, and no one else."""
    # _get_running_loop() answers None outside a loop, where current_task() raises (and an
    # exception raised and caught on every sync acquire and release is not free).
    loop = asyncio._get_running_loop()  # noqa: SLF001 (public in asyncio's namespace)
    task = 0 if loop is None else id(asyncio.current_task(loop))
    return (os.getpid(), threading.get_ident(), task)


@dataclass(eq=False, slots=True, weakref_slot=True)
class Lease:
    """What an acquired lock holds. Shared by the handles of a re-entrant owner."""

    redlock: Redlock
    resource: str
    key: str
    ttl: float
    value: str  # token + owner, exactly as stored on the masters
    valid_until: float  # monotonic deadline of guaranteed exclusivity
    acquired_at: float
    owner: tuple[int, int, int]
    #: The handle that acquired it, for events. Weak: a lease lives exactly as long as a handle
    #: holds it, so dropping an unreleased lock also stops its auto-extension at once.
    handle: weakref.ref[Lock]
    on_lost: Callable[[Lock, LockLost], None] | None = None
    depth: int = 1
    released: bool = False
    lost: bool = False
    fence: int | None = None
    extensions: int = 0
    #: The waiter id the holder had in the masters' queues, if it waited ("" if not).
    queued_as: str = ""

    @property
    def validity(self) -> float:
        return max(0.0, self.valid_until - time.monotonic())

    def check_lost(self) -> bool:
        """True if lost; marks it lost (once, with notice) when the validity has run out."""
        if not self.lost and not self.released and time.monotonic() >= self.valid_until:
            self.mark_lost(self.lost_message())
        return self.lost

    def lost_message(self) -> str:
        return (
            f"lock {self.resource!r} was lost: its lease (ttl={self.ttl}s) ran out or was not "
            f"renewed in time; another owner may have held it since"
        )

    def mark_lost(self, message: str) -> LockLost:
        error = LockLost(self.resource, message)
        handle = self.handle()
        if not self.lost and not self.released:
            self.lost = True
            if handle is None:
                return error
            notify(self.redlock.observer, "lost", handle, error=error)
            if self.on_lost is not None:
                try:
                    self.on_lost(handle, error)
                except Exception:  # noqa: BLE001 (a callback's bug must not break the lock)
                    from .events import logger

                    logger.exception("on_lost callback failed for %r", self.resource)
        return error


class Lock:
    """A lock on ``resource`` over the masters of a ``Redlock``; make one with
    ``Redlock.lock()`` (or ``django_redlock.redlock()``). One handle holds one lease at a time."""

    def __init__(
        self,
        redlock: Redlock,
        resource: str,
        *,
        ttl: float,
        wait: float,
        label: str | None = None,
        auto_extend: bool = False,
        max_extensions: int | None = None,
        max_hold: float | None = None,
        reentrant: bool = False,
        on_lost: Callable[[Lock, LockLost], None] | None = None,
    ) -> None:
        self._redlock = redlock
        self.resource = protocol.check_resource(resource)
        self.ttl = protocol.check_ttl(ttl)
        self.wait = protocol.check_seconds("wait", wait, allow_zero=True)
        if label is not None and not isinstance(label, str):
            raise ValueError(f"label must be a str, got {label!r}")
        if max_extensions is not None and (
            isinstance(max_extensions, bool)
            or not isinstance(max_extensions, int)
            or max_extensions < 0
        ):
            raise ValueError(f"max_extensions must be an int >= 0, got {max_extensions!r}")
        if max_hold is not None:
            max_hold = protocol.check_seconds("max_hold", max_hold, allow_zero=False)
        if on_lost is not None and not callable(on_lost):
            raise ValueError(f"on_lost must be callable, got {on_lost!r}")
        self.label = label
        self.auto_extend = bool(auto_extend)
        self.max_extensions = max_extensions
        self.max_hold = max_hold
        self.reentrant = bool(reentrant)
        self.on_lost = on_lost
        self.key = redlock.lock_key(resource)
        self._lease: Lease | None = None

    def __repr__(self) -> str:
        lease = self._lease
        state = "unlocked" if lease is None else "lost" if lease.lost else "held"
        return f"<Lock {self.resource!r} {state}>"

    # --- what the holder can ask -----------------------------------------------------------------

    @property
    def held(self) -> bool:
        """Acquired, not released, and still within validity."""
        return self._lease is not None and not self._lease.check_lost()

    @property
    def validity(self) -> float:
        """Seconds of guaranteed exclusivity left (0.0 when not held), on the monotonic clock."""
        lease = self._lease
        return 0.0 if lease is None or lease.lost else lease.validity

    @property
    def lost(self) -> bool:
        """True once the lease ran out, or a renewal found our token gone, while we held it."""
        return self._lease is not None and self._lease.check_lost()

    @property
    def fence(self) -> int:
        """The fencing token of this lease: an int that strictly increases per resource across
        all holders. Issued by a quorum the first time it is read (two rounds), then cached.
        In async code use ``await lock.afence()``."""
        return run(self._redlock, self._fence())

    async def afence(self) -> int:
        from .aio import arun

        return await arun(self._redlock, self._fence())

    def check(self) -> None:
        """Raise ``LockLost`` unless the lock is still held within its validity."""
        lease = self._held_lease("check")
        if lease.check_lost():
            raise LockLost(self.resource, lease.lost_message())

    # --- sync API --------------------------------------------------------------------------------

    def acquire(self) -> Lock:
        """Acquire the lock, trying until ``wait`` runs out; raise ``LockContended`` or
        ``QuorumUnavailable`` if it cannot."""
        if not self._reenter():
            run(self._redlock, self._acquire())
        return self

    def extend(self) -> float:
        """Renew the lease to the full TTL on a quorum; returns the new validity in seconds.
        Retries until renewed or the lease runs out, then raises ``LockLost``."""
        return run(self._redlock, self._extend(self._held_lease("extend"), once=False))

    def release(self) -> None:
        """Delete our key on every master (compare-and-delete: never another owner's)."""
        lease = self._detach()
        if lease is not None:
            run(self._redlock, self._release(lease))

    def __enter__(self) -> Lock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._lease
        lost = lease is not None and lease.check_lost()
        self.release()
        if lease is not None and lost:
            self._report_lost(lease, exc)

    # --- async API (same procedures, performed by aio.arun) --------------------------------------

    async def aacquire(self) -> Lock:
        from .aio import arun

        if not self._reenter():
            await arun(self._redlock, self._acquire())
        return self

    async def aextend(self) -> float:
        from .aio import arun

        return await arun(self._redlock, self._extend(self._held_lease("extend"), once=False))

    async def arelease(self) -> None:
        from .aio import arun

        lease = self._detach()
        if lease is not None:
            await arun(self._redlock, self._release(lease))

    async def __aenter__(self) -> Lock:
        return await self.aacquire()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._lease
        lost = lease is not None and lease.check_lost()
        await self.arelease()
        if lease is not None and lost:
            self._report_lost(lease, exc)

    # --- the procedures --------------------------------------------------------------------------

    def _acquire(self) -> Procedure[None]:
        redlock = self._redlock
        began = time.monotonic()
        deadline = began + self.wait
        ttl_ms = int(self.ttl * 1000)
        queue = redlock.queue_key(self.resource)
        attempts = 0
        waiter: Waiter | None = None
        split_retried = False
        courtesy = redlock.courtesy_until(self.resource) - began
        try:
            if courtesy > 0 and self.wait > 0:
                # We just woke a waiter by releasing this lock: let it go first, then join the queue
                # behind it (as a waiter at once: a plain SET would only lose).
                waiter = yield Listen()
                yield Pause(min(courtesy, self.wait))
            while True:
                attempts += 1
                value = self._new_value()
                start = time.monotonic()
                if waiter is None:
                    request = Round(("SET", self.key, value, "NX", "PX", ttl_ms))
                else:  # the same SET; if it loses, we queue up on the masters to be woken in turn
                    wait_ms = max(int((deadline - start) * 1000), 1)
                    command = scripts.ACQUIRE_WAITING.evalsha(
                        (self.key, queue), (value, ttl_ms, waiter.id, wait_ms)
                    )
                    request = Round(command, scripts.ACQUIRE_WAITING)
                try:
                    replies: list[Reply] = yield request
                except BaseException:
                    # Interrupted (task cancelled, Ctrl-C) while SETs were in flight: some may have
                    # landed. Undo them on every master before letting the interruption through.
                    yield self._release_round(value, cleanup=True, notify=False)
                    raise
                result = self._tally(replies, start)
                if result.won:
                    self._hold(value, start, began, attempts, "" if waiter is None else waiter.id)
                    return
                if result.granted or result.failed:
                    # Undo partial success everywhere, failed masters included: a SET that timed out
                    # may still have landed, and would otherwise block others until its TTL.
                    yield self._release_round(value, notify=False)
                now = time.monotonic()
                if now >= deadline:
                    raise self._not_acquired(result, replies, attempts, now - began)
                if result.contended and waiter is None:
                    # Become a waiter (subscribed), then try once more: that try queues us if it
                    # loses, and a release between our attempts cannot be missed, since the next try
                    # then finds the lock free.
                    waiter = yield Listen()
                    continue
                if result.contended and result.granted and not split_retried:
                    # Some masters were free: perhaps a split vote with another waiter and no
                    # holder, so no release would wake us. Try once more shortly, older waiters
                    # first. (Once: a holder on a bare quorum looks the same, and is waited for.)
                    split_retried = True
                    yield Pause(protocol.split_retry_delay(now - began, _JITTER))
                    continue
                delay = protocol.retry_delay(redlock.retry_delay, _JITTER)
                if result.contended and waiter is not None:
                    # Queued: sleep until a release names us (or the fallback: a lease may expire
                    # unreleased, with no release to wake anyone).
                    split_retried = False
                    yield AwaitNotice(waiter, min(delay, deadline - now))
                    continue
                if now + delay > deadline:
                    raise self._not_acquired(result, replies, attempts, now - began)
                yield Pause(delay)
        except BaseException as exc:
            if waiter is not None and not isinstance(exc, GeneratorExit | LockNotAcquired):
                # Interrupted while a waiter (a cancelled task, Ctrl-C): leave the queues, or the
                # next release would wake a name that no one answers to any more.
                yield Round(("ZREM", queue, waiter.id), cleanup=True)
            raise

    def _extend(self, lease: Lease, *, once: bool) -> Procedure[float]:
        """Renew ``lease``. With ``once``, a single round: returns the new validity, or 0.0 when
        this round failed but the lease is still valid (the watchdog tries again)."""
        redlock = self._redlock
        ttl_ms = int(lease.ttl * 1000)
        while True:
            start = time.monotonic()
            if lease.check_lost():
                raise LockLost(lease.resource, lease.lost_message())
            replies: list[Reply] = yield Round(
                scripts.EXTEND.evalsha((lease.key,), (lease.value, ttl_ms)), scripts.EXTEND
            )
            if lease.released:
                return 0.0  # released meanwhile (the watchdog raced the holder): nothing to say
            result = self._tally(replies, start, ttl=lease.ttl)
            # Counts only if a quorum renewed it *before* the old lease ran out: after that,
            # someone else may have held the lock in between, and renewing would hide it.
            if result.won and time.monotonic() < lease.valid_until:
                lease.valid_until = (
                    start + lease.ttl - protocol.drift(lease.ttl, redlock.drift_factor)
                )
                lease.extensions += 1
                return lease.validity
            if result.lost:
                raise lease.mark_lost(
                    f"lock {lease.resource!r} is gone from {result.denied} of {result.total} "
                    f"masters: it expired or was released by force"
                )
            delay = protocol.retry_delay(redlock.retry_delay, _JITTER)
            if time.monotonic() + delay >= lease.valid_until:
                raise lease.mark_lost(
                    f"could not renew lock {lease.resource!r} on a quorum before its lease ran "
                    f"out: " + "; ".join(str(f) for f in failures(redlock, replies))
                )
            if once:
                return 0.0
            yield Pause(delay)

    def _release(self, lease: Lease) -> Procedure[None]:
        if lease.owner[0] != os.getpid():
            return  # a forked child never releases its parent's lock
        try:
            replies: list[Reply] = yield self._release_round(lease.value, queued_as=lease.queued_as)
        except BaseException:
            # Interrupted (a cancelled task): finish the release, shielded, before letting the
            # interruption through, so that a cancellation never leaves the lock held.
            yield self._release_round(lease.value, cleanup=True, queued_as=lease.queued_as)
            raise
        held = time.monotonic() - lease.acquired_at
        woken = max((r for r in replies if isinstance(r, int)), default=0) - 1
        if woken > 0:
            self._redlock.give_way(lease.resource, COURTESY)
        notify(self._redlock.observer, "released", self, held=held)

    def _fence(self) -> Procedure[int]:
        lease = self._held_lease("fence")
        if lease.fence is not None:
            return lease.fence
        redlock = self._redlock
        fence_key = redlock.fence_key(lease.resource)
        replies: list[Reply] = yield Round(("GET", fence_key))
        counters = [None if isinstance(r, NodeFailure) else int(r or 0) for r in replies]  # type: ignore[call-overload]
        token = protocol.fence_merge(counters, len(redlock.nodes))
        if token is None:
            raise self._fence_unavailable(replies)
        # Write the token back before anyone uses it: any later reading quorum then meets a
        # master that holds it, so the next token is higher (a majority max-register).
        replies = yield Round(
            scripts.FENCE_RAISE.evalsha((fence_key,), (token,)), scripts.FENCE_RAISE
        )
        if sum(not isinstance(r, NodeFailure) for r in replies) < redlock.quorum:
            raise self._fence_unavailable(replies)
        if lease.check_lost():
            raise LockLost(lease.resource, lease.lost_message())
        lease.fence = token
        return token

    def _release_round(
        self, value: str, *, cleanup: bool = False, notify: bool = True, queued_as: str = ""
    ) -> Round:
        command = self._redlock.release_command(
            self.resource, value, notify=notify, queued_as=queued_as
        )
        return Round(command, scripts.RELEASE, cleanup)

    # --- helpers ---------------------------------------------------------------------------------

    def _hold(
        self, value: str, start: float, began: float, attempts: int, queued_as: str = ""
    ) -> None:
        redlock = self._redlock
        now = time.monotonic()
        lease = Lease(
            redlock=redlock,
            resource=self.resource,
            key=self.key,
            ttl=self.ttl,
            value=value,
            valid_until=start + self.ttl - protocol.drift(self.ttl, redlock.drift_factor),
            acquired_at=now,
            owner=current_owner(),
            handle=weakref.ref(self),
            on_lost=self.on_lost,
            queued_as=queued_as,
        )
        self._lease = lease
        redlock.holders[self.key] = lease
        if self.auto_extend:
            redlock.watchdog.watch(lease, self.max_extensions, self.max_hold)
        notify(redlock.observer, "acquired", self, waited=now - began, attempts=attempts)

    def _reenter(self) -> bool:
        """True if this owner already holds the resource and re-entered it (``reentrant=True``);
        ``LockContended`` at once if it holds it and may not re-enter (waiting would be waiting
        for ourselves); False if we must acquire for real."""
        if self._lease is not None:
            raise RuntimeError(
                f"lock {self.resource!r} is already acquired through this object; "
                f"use one Lock object per acquisition"
            )
        outer = self._redlock.holders.get(self.key)
        if outer is None or outer.released or outer.owner != current_owner():
            return False
        if outer.check_lost() and not self.reentrant:
            return False  # its lease ran out: we do not hold it any more, so acquire for real
        if not self.reentrant:
            error = LockContended(
                self.resource,
                f"lock {self.resource!r} is already held by this same thread/task: acquiring it "
                f"again would wait for ourselves; pass reentrant=True to re-enter it",
            )
            notify(self._redlock.observer, "not_acquired", self, waited=0.0, error=error)
            raise error
        if outer.check_lost():
            raise LockLost(self.resource, outer.lost_message())
        outer.depth += 1
        self._lease = outer
        return True

    def _detach(self) -> Lease | None:
        """Let go of our lease; return it if we were its last holder (release it on the masters),
        None for an inner re-entrant handle or a lock that was never acquired."""
        lease = self._lease
        if lease is None:
            raise RuntimeError(f"cannot release lock {self.resource!r}: it is not acquired")
        owner = current_owner()
        if lease.owner[0] == owner[0] and lease.owner != owner:
            raise RuntimeError(
                f"lock {self.resource!r} was acquired by another thread or task; only its owner "
                f"may release it"
            )
        self._lease = None
        lease.depth -= 1
        if lease.depth > 0:
            return None
        lease.released = True
        if self._redlock.holders.get(self.key) is lease:
            del self._redlock.holders[self.key]
        return lease

    def _held_lease(self, action: str) -> Lease:
        lease = self._lease
        if lease is None:
            raise RuntimeError(f"cannot {action} lock {self.resource!r}: it is not acquired")
        if lease.owner[0] != os.getpid():
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it was acquired by process "
                f"{lease.owner[0]}, and a forked child does not hold its parent's locks"
            )
        return lease

    def _new_value(self) -> str:
        """What we store on each master: an unguessable token, then who we are (for humans):
        ``<32 hex>:{"host":..,"pid":..,"thread":..,"label":..,"ttl":..,"since":<unix time>}``."""
        who = (os.getpid(), threading.get_ident(), self.label, self.ttl)
        owner_json = _OWNER_JSON.get(who)
        if owner_json is None:
            fields = {
                "host": _HOST,
                "pid": who[0],
                "thread": threading.current_thread().name,
                "label": self.label,
                "ttl": self.ttl,
            }
            # Everything but the closing brace: "since" changes with every acquisition.
            owner_json = json.dumps(fields, separators=(",", ":"))[:-1]
            if len(_OWNER_JSON) >= 1024:  # bounded: threads come and go
                _OWNER_JSON.clear()
            _OWNER_JSON[who] = owner_json
        since = f"{time.time():.3f}"  # wall clock, for display only
        return f'{secrets.token_hex(16)}:{owner_json},"since":{since}}}'

    def _tally(self, replies: list[Reply], start: float, ttl: float | None = None) -> Tally:
        return protocol.tally(
            [vote(r) for r in replies],
            ttl=self.ttl if ttl is None else ttl,
            elapsed=time.monotonic() - start,
            drift_factor=self._redlock.drift_factor,
        )

    def _not_acquired(
        self, result: Tally, replies: list[Reply], attempts: int, waited: float
    ) -> LockContended | QuorumUnavailable:
        detail = failures(self._redlock, replies)
        tries = f"{attempts} attempt{'s' if attempts > 1 else ''}"
        error: LockContended | QuorumUnavailable
        if result.granted >= result.quorum:
            error = QuorumUnavailable(
                self.resource,
                f"lock {self.resource!r}: masters answered too late, no validity left of "
                f"ttl={self.ttl}s ({tries})",
                detail,
                attempts=attempts,
            )
        elif result.contended:
            error = LockContended(
                self.resource,
                f"lock {self.resource!r} is held by another owner ({tries}, wait={self.wait}s)",
                detail,
                attempts=attempts,
            )
        else:
            error = QuorumUnavailable(
                self.resource,
                f"lock {self.resource!r}: only {result.granted + result.denied} of "
                f"{result.total} masters answered, {result.quorum} needed ({tries})",
                detail,
                attempts=attempts,
            )
        notify(self._redlock.observer, "not_acquired", self, waited=waited, error=error)
        return error

    def _fence_unavailable(self, replies: list[Reply]) -> QuorumUnavailable:
        return QuorumUnavailable(
            self.resource,
            f"lock {self.resource!r}: no quorum of masters answered for its fencing token",
            failures(self._redlock, replies),
        )

    @staticmethod
    def _report_lost(lease: Lease, exc: BaseException | None) -> None:
        message = lease.lost_message()
        if exc is not None:
            # Do not mask the block's own error; say on it that exclusivity was also lost.
            exc.add_note(message)
            return
        raise LockLost(lease.resource, message)
