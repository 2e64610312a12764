"""A ``Lease``: what one acquisition holds (the value on the masters, its validity deadline, its
fence), and who holds it.

The holder is the acquisition's owner: the asyncio task or the thread that acquired, kept as the
live object (never ``id()`` or a thread id, which Python reuses), so that a task created after the
owner ended can never be taken for it. The lease keeps its owner alive while it lives.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar, overload

from ..base import protocol, values
from ..base.errors import LockLost, NodeFailure
from ..base.events import logger, notify
from .callbacks import DISPATCHER

if TYPE_CHECKING:
    from ..algorithm.steps import Round

T = TypeVar("T")

#: Who acts: the running asyncio task, else the current thread (the objects themselves).
Owner = object


def current_owner() -> Owner:
    """The task or thread acting now. Re-entry and release are allowed to the owner that
    acquired, and no one else."""
    # _get_running_loop() answers None outside a loop, where current_task() raises (and an
    # exception raised and caught on every sync acquire and release is not free).
    loop = asyncio._get_running_loop()  # noqa: SLF001 (public in asyncio's namespace)
    if loop is not None:
        task = asyncio.current_task(loop)
        if task is not None:
            return task
    return threading.current_thread()


class LeaseHandle(Protocol):
    """What a lease needs of the handle that acquired it (a ``kinds.lock.Lock``): whom to tell
    of its loss, and the handle's own ``at_least`` (``handles.bounds``)."""

    @property
    def resource(self) -> str: ...
    @property
    def at_least(self) -> float | None: ...
    @property
    def on_lost(self) -> Callable[[Self, LockLost], None] | None: ...
    #: Its ``Redlock``, typed where it is known (``handles.fields.Engine``): the lease tells its
    #: ``observer``, the watchdog renews the lease through it.
    @property
    def _redlock(self) -> Any: ...


class Watcher(Protocol):
    """What watches a lease (the watchdog): told when an extend changes its schedule."""

    def reschedule(self, lease: Lease) -> None: ...


#: Guards each lease's extension bookkeeping (count, generation, deadline) between the holder
#: and the watchdog: one lock for all leases (held for a few bytecodes, never across I/O).
_BOOKS = threading.Lock()

#: Makes a lease's ``_SeldomFields`` (two threads setting two of its fields at once must not
#: each make one and lose the other's write). Never held while taking another lock.
_SELDOM_GUARD = threading.Lock()


def _after_fork_in_child() -> None:
    global _BOOKS, _SELDOM_GUARD
    # A parent thread may have held them at the fork.
    _BOOKS, _SELDOM_GUARD = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def describe(owner: Owner) -> str:
    """A name for error messages: the task's or the thread's."""
    if isinstance(owner, asyncio.Task):
        return f"task {owner.get_name()!r}"
    if isinstance(owner, threading.Thread):
        return f"thread {owner.name!r}"
    return repr(owner)


class LeaseCommands(Protocol):
    """The requests that renew and release a lease whose keys are not a plain lock's (a
    semaphore's permit, a reader): its mode's own scripts, still compare-and-act on our value."""

    def extend(self, lease: Lease, ttl_ms: int) -> Round: ...
    def release(self, lease: Lease, *, cleanup: bool = False) -> Round: ...


#: The fields of a lease that most leases never change from these defaults: its caps, the
#: extension bookkeeping, its fences, why it was lost, a waiter's queue id, a mode's commands
#: (see ``_seldom``).
_SELDOM_DEFAULTS: dict[str, Any] = {
    "at_least": None,
    "auto_extend": False,
    "commands": None,
    "extensions": 0,
    "fences": None,
    "generation": 0,
    "lost_failures": (),
    "lost_reason": "",
    "max_extensions": None,
    "max_hold": None,
    "queued_as": "",
    "schedule": 0,
    "unsettled": None,
}


class _SeldomFields:
    """The seldom fields of one lease that has set any of them (or of all the others)."""

    __slots__ = tuple(_SELDOM_DEFAULTS)

    def __init__(self) -> None:
        for name, value in _SELDOM_DEFAULTS.items():
            setattr(self, name, value)


#: The seldom fields of every lease that has set none of them: read, never written.
_NONE_SET = _SeldomFields()


class _Seldom(property, Generic[T]):
    """A lease field that most leases never change from its default (``_SELDOM_DEFAULTS``),
    kept in the lease's ``_seldom`` record: the shared ``_NONE_SET`` until the lease's first
    write to any of them makes its own. A held lock that waited for nobody, is never extended,
    fenced or lost, and is a plain lock, carries none of them: 96 bytes less per held lock.
    Read in C (a property over ``attrgetter``), nearly as fast as a field of its own."""

    def __init__(self, name: str) -> None:
        field = getattr(_SeldomFields, name)  # the record's slot

        def write(lease: Lease, value: object) -> None:
            seldom = lease._seldom
            if seldom is _NONE_SET:
                with _SELDOM_GUARD:
                    seldom = lease._seldom
                    if seldom is _NONE_SET:
                        seldom = lease._seldom = _SeldomFields()
            field.__set__(seldom, value)

        super().__init__(attrgetter(f"_seldom.{name}"), write)

    if TYPE_CHECKING:  # what the property reads and takes, for the type checker

        @overload
        def __get__(self, lease: None, owner: type | None = None, /) -> _Seldom[T]: ...
        @overload
        def __get__(self, lease: Lease, owner: type | None = None, /) -> T: ...
        def __get__(self, lease: Lease | None, owner: type | None = None, /) -> Any: ...
        def __set__(self, lease: Lease, value: T, /) -> None: ...


class Lease:
    """What an acquired lock holds. Shared by the handles of a re-entrant owner.

    Slots, and only those that most held locks need: one lease is kept per held lock, so every
    field costs that much per held lock. What can be read elsewhere is: the name (``resource``,
    from ``resources``), the observer and ``on_lost`` (the acquiring handle's, told only while
    it lives); what few leases set is kept apart (``_Seldom``)."""

    __slots__ = (
        "__weakref__", "_owner_text", "_seldom", "_stamp", "acquired_at", "depth", "handle",
        "keys", "lost", "owner", "pid", "released", "resources", "ttl", "valid_until", "watcher",
    )  # fmt: skip

    #: Why it was lost, as first found (a forced release, the masters gone...): every later
    #: report (``check()``, the block's exit) gives that reason, not a generic one.
    lost_reason: _Seldom[str] = _Seldom("lost_reason")
    lost_failures: _Seldom[tuple[NodeFailure, ...]] = _Seldom("lost_failures")
    #: Fencing tokens, by resource, once read (None until the first: most leases never are).
    fences: _Seldom[dict[str, int] | None] = _Seldom("fences")
    #: Extensions made or under way (reserved before their round: see ``reserve_extension``),
    #: and the caps on them.
    extensions: _Seldom[int] = _Seldom("extensions")
    max_extensions: _Seldom[int | None] = _Seldom("max_extensions")
    max_hold: _Seldom[float | None] = _Seldom("max_hold")
    #: Seconds after it was taken that it is kept at least (an inner re-entry's ``at_least``:
    #: ``bounds``); the releasing handle's own ``at_least`` counts too.
    at_least: _Seldom[float | None] = _Seldom("at_least")
    #: Counts extend rounds as they are sent: a round's outcome is applied only if no round
    #: was sent after it (the later-started one wins, see ``renewed``).
    generation: _Seldom[int] = _Seldom("generation")
    #: Rounds sent and not yet answered (generation -> their TTL); made by the first one.
    unsettled: _Seldom[dict[int, float] | None] = _Seldom("unsettled")
    #: Whether the watchdog renews it (cleared when a cap stops the renewals), and which of the
    #: watcher's scheduled looks at it is the live one.
    auto_extend: _Seldom[bool] = _Seldom("auto_extend")
    schedule: _Seldom[int] = _Seldom("schedule")
    #: The waiter id the holder had in the masters' queues, if it waited ("" if not).
    queued_as: _Seldom[str] = _Seldom("queued_as")
    #: How to renew and release it on the masters when that is not the plain lock's way
    #: (a permit of a semaphore, a reader): None for a plain lock.
    commands: _Seldom[LeaseCommands | None] = _Seldom("commands")

    def __init__(  # (positional too: ``granting.granted`` passes them so, see there)
        self,
        resources: tuple[str, ...],
        keys: tuple[str, ...],
        ttl: float,
        value: str,
        valid_until: float,
        owner: Owner,
        pid: int,
        handle: LeaseHandle,
        queued_as: str = "",
        max_extensions: int | None = None,
        max_hold: float | None = None,
        commands: LeaseCommands | None = None,
        parts: tuple[bytes, str] | None = None,
    ) -> None:
        self._seldom = _NONE_SET
        self.resources = resources
        self.keys = keys  # the keys on the masters
        self.ttl = ttl
        # Its value, in the parts that the locks of one owner do not each keep a copy of
        # (``parts``: as they were made, else read back from the value).
        self._stamp, self._owner_text = parts or values.compact_value(value)
        self.valid_until = valid_until  # monotonic deadline of guaranteed exclusivity
        self.acquired_at = time.monotonic()
        self.owner = owner
        self.pid = pid
        #: The handle that acquired it, for events. Weak: a lease lives exactly as long as a
        #: handle holds it, so dropping an unreleased lock also stops its auto-extension at once.
        self.handle: weakref.ref[LeaseHandle] = weakref.ref(handle)
        self.depth = 1
        self.released = False
        self.lost = False
        self.watcher: Watcher | None = None  # who watches it (the watchdog)
        if max_extensions is not None:
            self.max_extensions = max_extensions
        if max_hold is not None:
            self.max_hold = max_hold
        if queued_as:
            self.queued_as = queued_as
        if commands is not None:
            self.commands = commands

    @property
    def value(self) -> str:
        """Token + owner, exactly as stored on the masters: never shown."""
        return values.expand_value(self._stamp, self._owner_text)

    @property
    def resource(self) -> str:
        """The name (several: joined), for messages."""
        resources = self.resources
        return resources[0] if len(resources) == 1 else " + ".join(resources)

    def __repr__(self) -> str:
        # Never the value: error pages and trackers that capture locals would show the token.
        state = "released" if self.released else "lost" if self.lost else "held"
        return f"<Lease {self.resource!r} {state}, {describe(self.owner)}>"

    @property
    def validity(self) -> float:
        return max(0.0, self.valid_until - time.monotonic())

    # --- extension bookkeeping (the holder's thread and the watchdog's, each atomic) ----------

    def reserve_extension(self) -> bool:
        """Count one more extension before its round is sent; False at ``max_extensions``. A
        holder's ``extend()`` and a renewal overlapping it cannot both pass the last one."""
        with _BOOKS:
            if self.max_extensions is not None and self.extensions >= self.max_extensions:
                return False
            self.extensions += 1
            return True

    def give_back_extension(self) -> None:
        """The reserved extension renewed nothing (its round failed): it does not count."""
        with _BOOKS:
            self.extensions -= 1

    def begin_round(self, ttl: float, start: float, drift_factor: float) -> tuple[int, float]:
        """An extend round for ``ttl`` seconds, started at ``start``, is about to be sent. From
        now on the masters may hold the new TTL, whatever becomes of the round (cut by a
        timeout, a cancel, Ctrl-C): a shorter one shortens the lease now. The new TTL is the
        lease's (a renewal sent later uses it).

        Returns the round's generation, and until when the lease is ours if it renews: its
        start + TTL - drift, or less if a round sent before it with a shorter TTL is still
        unanswered. That one may land after it on a master (the holder and the watchdog use
        different connections, and a master orders only each connection's requests), and then
        leaves the master at least ``start`` + its own TTL."""
        with _BOOKS:
            self.generation += 1
            self.ttl = ttl
            own = start + ttl - protocol.drift(ttl, drift_factor)
            if own < self.valid_until:
                self.valid_until = own
            if self.unsettled is None:
                self.unsettled = {}
            shortest = min(ttl, *self.unsettled.values()) if self.unsettled else ttl
            self.unsettled[self.generation] = ttl
            return self.generation, start + shortest - protocol.drift(shortest, drift_factor)

    def settled(self, generation: int) -> None:
        """The round of ``generation`` is answered (or given up: its replies are dropped)."""
        with _BOOKS:
            if self.unsettled is not None:
                self.unsettled.pop(generation, None)

    def renewed(self, generation: int, until: float) -> bool:
        """A quorum renewed the round of ``generation``: the lease is ours ``until``, unless a
        round was sent after it (that one may carry another TTL and land after it: its own
        outcome will say) or the lease ran out before the reply (someone else may have held it
        in between: renewing would hide that). True if it was applied."""
        with _BOOKS:
            if generation != self.generation or time.monotonic() >= self.valid_until:
                return False
            self.valid_until = until
            return True

    def check_lost(self) -> bool:
        """True if lost; marks it lost (once, with notice) when the validity has run out."""
        if not self.lost and not self.released and time.monotonic() >= self.valid_until:
            self.mark_lost(self.lost_message())
        return self.lost

    def lost_message(self) -> str:
        if self.lost_reason:
            return self.lost_reason
        return (
            f"lock {self.resource!r} was lost: its lease (ttl={self.ttl}s) ran out or was not "
            f"renewed in time; another owner may have held it since"
        )

    def lost_error(self) -> LockLost:
        """A fresh ``LockLost`` with the reason and per-master detail the loss was found with."""
        return LockLost(self.resource, self.lost_message(), self.lost_failures)

    def mark_lost(self, message: str, failures: Sequence[NodeFailure] = ()) -> LockLost:
        """Mark the lease lost and tell (once: the observer's ``lost``, ``on_lost``); the error
        to raise. A release that finds the lease gone tells too: nobody may have noticed yet."""
        error = LockLost(self.resource, message, failures)
        if self.lost:
            return error
        self.lost = True
        self.lost_reason, self.lost_failures = message, error.failures
        handle = self.handle()
        if handle is not None:
            # At once, or (noticed by the watchdog) on the callbacks' thread: see ``callbacks``.
            DISPATCHER.call(self._tell_lost, handle, error)
        return error

    def _tell_lost(self, handle: LeaseHandle, error: LockLost) -> None:
        notify(handle._redlock.observer, "lost", handle, error=error)
        on_lost = handle.on_lost
        if on_lost is not None:
            try:
                on_lost(handle, error)
            except Exception:  # noqa: BLE001 (a callback's bug must not break the lock)
                logger.exception("on_lost callback failed for %r", self.resource)

    def note_failures(self, failures: Sequence[NodeFailure], action: str) -> None:
        """An action that succeeded although some masters failed: say which, and why (one more
        failure there may cost the quorum)."""
        if not failures:
            return
        failed = [f for f in failures if f.reason in ("timeout", "error", "quarantine")]
        handle = self.handle()
        if failed and handle is not None:
            DISPATCHER.call(
                notify,
                handle._redlock.observer,
                "masters_failed",
                handle,
                action=action,
                failures=failed,
            )
