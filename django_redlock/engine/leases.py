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
from typing import TYPE_CHECKING, Protocol

from . import process, protocol
from .callbacks import DISPATCHER
from .errors import LockLost, NodeFailure
from .events import logger, notify

if TYPE_CHECKING:
    from .events import Observer
    from .lock import Lock
    from .steps import Round

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


class Watcher(Protocol):
    """What watches a lease (the watchdog): told when an extend changes its schedule."""

    def reschedule(self, lease: Lease) -> None: ...


#: Guards each lease's extension bookkeeping (count, generation, deadline) between the holder
#: and the watchdog: one lock for all leases (held for a few bytecodes, never across I/O).
_BOOKS = threading.Lock()


def _after_fork_in_child() -> None:
    global _BOOKS
    _BOOKS = threading.Lock()  # a parent thread may have held it at the fork


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


class Lease:
    """What an acquired lock holds. Shared by the handles of a re-entrant owner."""

    __slots__ = (
        "__weakref__",
        "acquired_at",
        "auto_extend",
        "commands",
        "depth",
        "extensions",
        "fences",
        "generation",
        "handle",
        "key",
        "keys",
        "lost",
        "lost_failures",
        "lost_reason",
        "max_extensions",
        "max_hold",
        "observer",
        "on_lost",
        "owner",
        "pid",
        "queued_as",
        "released",
        "resource",
        "resources",
        "schedule",
        "ttl",
        "unsettled",
        "valid_until",
        "value",
        "watcher",
    )

    def __init__(
        self,
        *,
        resource: str,
        resources: tuple[str, ...],
        key: str,
        keys: tuple[str, ...],
        ttl: float,
        value: str,
        valid_until: float,
        owner: Owner,
        pid: int,
        handle: Lock,
        observer: Observer,
        on_lost: Callable[[Lock, LockLost], None] | None = None,
        queued_as: str = "",
        max_extensions: int | None = None,
        max_hold: float | None = None,
        commands: LeaseCommands | None = None,
    ) -> None:
        self.resource = resource  # the name (several: joined), for messages
        self.resources = resources
        self.key = key  # its keys named as one (several: joined)
        self.keys = keys  # the keys on the masters
        self.ttl = ttl
        self.value = value  # token + owner, exactly as stored on the masters: never shown
        self.valid_until = valid_until  # monotonic deadline of guaranteed exclusivity
        self.acquired_at = time.monotonic()
        self.owner = owner
        self.pid = pid
        #: The handle that acquired it, for events. Weak: a lease lives exactly as long as a
        #: handle holds it, so dropping an unreleased lock also stops its auto-extension at once.
        self.handle: weakref.ref[Lock] = weakref.ref(handle)
        self.observer = observer
        self.on_lost = on_lost
        self.depth = 1
        self.released = False
        self.lost = False
        #: Why it was lost, as first found (a forced release, the masters gone...): every later
        #: report (``check()``, the block's exit) gives that reason, not a generic one.
        self.lost_reason = ""
        self.lost_failures: tuple[NodeFailure, ...] = ()
        #: Fencing tokens, by resource, once read (None until the first: most leases never are).
        self.fences: dict[str, int] | None = None
        #: Extensions made or under way (reserved before their round: see ``reserve_extension``).
        self.extensions = 0
        self.max_extensions = max_extensions
        self.max_hold = max_hold
        #: Counts extend rounds as they are sent: a round's outcome is applied only if no round
        #: was sent after it (the later-started one wins, see ``renewed``).
        self.generation = 0
        #: Rounds sent and not yet answered (generation -> their TTL); made by the first one.
        self.unsettled: dict[int, float] | None = None
        #: Whether the watchdog renews it (cleared when a cap stops the renewals), who watches
        #: it, and which of the watcher's scheduled looks at it is the live one.
        self.auto_extend = False
        self.watcher: Watcher | None = None
        self.schedule = 0
        #: The waiter id the holder had in the masters' queues, if it waited ("" if not).
        self.queued_as = queued_as
        #: How to renew and release it on the masters when that is not the plain lock's way
        #: (a permit of a semaphore, a reader): None for a plain lock.
        self.commands = commands

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

    def _tell_lost(self, handle: Lock, error: LockLost) -> None:
        notify(self.observer, "lost", handle, error=error)
        if self.on_lost is not None:
            try:
                self.on_lost(handle, error)
            except Exception:  # noqa: BLE001 (a callback's bug must not break the lock)
                logger.exception("on_lost callback failed for %r", self.resource)

    def note_failures(self, failures: Sequence[NodeFailure], action: str) -> None:
        """An action that succeeded although some masters failed: say which, and why (one more
        failure there may cost the quorum)."""
        failed = [f for f in failures if f.reason in ("timeout", "error", "quarantine")]
        handle = self.handle()
        if failed and handle is not None:
            DISPATCHER.call(
                notify, self.observer, "masters_failed", handle, action=action, failures=failed
            )


class Callers:
    """Who holds what through one ``Lock`` handle: each caller's lease, by its owner (the task
    or thread object), how many times more it entered it through this handle (re-entrant), and
    whether each one's last lease was lost (readable after its release; held weakly, so a task
    or thread that ended is forgotten). A lease taken by another process (we are a forked child)
    is nobody's here."""

    __slots__ = ("_ended", "_leases", "_nested", "_one", "resource")

    def __init__(self, resource: str) -> None:
        self.resource = resource
        #: One caller at a time (the usual case) needs no dict: 220 of a held lock's 1,500 bytes.
        self._one: tuple[Owner, Lease] | None = None
        self._leases: dict[Owner, Lease] | None = None
        self._nested: dict[Owner, int] | None = None
        self._ended: weakref.WeakKeyDictionary[Owner, bool] | None = None

    def _lease_of(self, owner: Owner) -> Lease | None:
        one = self._one
        if one is not None and one[0] is owner:
            return one[1]
        return None if self._leases is None else self._leases.get(owner)

    def _forget(self, owner: Owner) -> None:
        if self._one is not None and self._one[0] is owner:
            self._one = None
        elif self._leases is not None:
            self._leases.pop(owner, None)

    def get(self, owner: Owner) -> Lease | None:
        lease = self._lease_of(owner)
        if lease is not None and lease.pid != process.pid():
            return None  # the parent's, copied by fork(): this process holds nothing
        return lease

    def add(self, owner: Owner, lease: Lease) -> None:
        mine = self._lease_of(owner)
        if mine is lease:  # re-entered through this same handle
            if self._nested is None:
                self._nested = {}
            self._nested[owner] = self._nested.get(owner, 0) + 1
            return
        if mine is not None:
            self._forget(owner)
        if self._one is None:
            self._one = (owner, lease)
        else:
            if self._leases is None:
                self._leases = {}
            self._leases[owner] = lease
        if self._nested:
            self._nested.pop(owner, None)

    def detach(self, owner: Owner, action: str) -> Lease:
        """``owner``'s lease, let go of once (its innermost entry through this handle)."""
        lease = self._lease_of(owner)
        if lease is None:
            owners = [*(self._one or ())[:1], *(self._leases or ())]
            holders = ", ".join(describe(o) for o in owners) or "nobody"
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it is not acquired by "
                f"{describe(owner)} through this object (held through it by: {holders}); only "
                f"the thread or task that acquired a lock may release it"
            )
        if lease.pid != process.pid():  # the parent's: forget it, every entry of it
            self._forget(owner)
            if self._nested:
                self._nested.pop(owner, None)
            raise self._forked(lease, action)
        if self._nested and owner in self._nested:
            if self._nested[owner] > 1:
                self._nested[owner] -= 1
            else:
                del self._nested[owner]
            return lease
        self._forget(owner)
        return lease

    def held(self, owner: Owner, action: str) -> Lease:
        """``owner``'s lease, or RuntimeError saying why it has none to ``action``."""
        lease = self._lease_of(owner)
        if lease is None:
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it is not acquired by "
                f"{describe(owner)} through this object"
            )
        if lease.pid != process.pid():
            raise self._forked(lease, action)
        return lease

    def _forked(self, lease: Lease, action: str) -> RuntimeError:
        return RuntimeError(
            f"cannot {action} lock {self.resource!r}: it was acquired by process {lease.pid}, "
            f"and a forked child does not hold its parent's locks (it may acquire its own)"
        )

    def ended(self, owner: Owner, lease: Lease) -> None:
        if self._ended is not None or lease.lost:  # (no weak dict made while none was lost)
            self._ended = weakref.WeakKeyDictionary() if self._ended is None else self._ended
            self._ended[owner] = lease.lost

    def was_lost(self, owner: Owner) -> bool:
        return bool(self._ended and self._ended.get(owner, False))
