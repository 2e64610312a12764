"""A ``Lease``: what one acquisition holds (the value on the masters, its validity deadline, its
fence), and who holds it.

The holder is the acquisition's owner: the asyncio task or the thread that acquired, kept as the
live object (never ``id()`` or a thread id, which Python reuses), so that a task created after the
owner ended can never be taken for it. The lease keeps its owner alive while it lives.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from . import process
from .errors import LockLost, NodeFailure
from .events import logger, notify

if TYPE_CHECKING:
    from .events import Observer
    from .lock import Lock

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


def describe(owner: Owner) -> str:
    """A name for error messages: the task's or the thread's."""
    if isinstance(owner, asyncio.Task):
        return f"task {owner.get_name()!r}"
    if isinstance(owner, threading.Thread):
        return f"thread {owner.name!r}"
    return repr(owner)


class Lease:
    """What an acquired lock holds. Shared by the handles of a re-entrant owner."""

    __slots__ = (
        "__weakref__",
        "acquired_at",
        "depth",
        "extensions",
        "fences",
        "handle",
        "key",
        "keys",
        "lost",
        "lost_failures",
        "lost_reason",
        "observer",
        "on_lost",
        "owner",
        "pid",
        "queued_as",
        "released",
        "resource",
        "resources",
        "ttl",
        "valid_until",
        "value",
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
    ) -> None:
        self.resource = resource  # the name (several: joined), for messages
        self.resources = resources
        self.key = key  # how this process recognizes re-entry (several: all keys, joined)
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
        #: Fencing tokens, by resource, once read.
        self.fences: dict[str, int] = {}
        self.extensions = 0
        #: The waiter id the holder had in the masters' queues, if it waited ("" if not).
        self.queued_as = queued_as

    def __repr__(self) -> str:
        # Never the value: error pages and trackers that capture locals would show the token.
        state = "released" if self.released else "lost" if self.lost else "held"
        return f"<Lease {self.resource!r} {state}, {describe(self.owner)}>"

    @property
    def validity(self) -> float:
        return max(0.0, self.valid_until - time.monotonic())

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
        if handle is None:
            return error
        notify(self.observer, "lost", handle, error=error)
        if self.on_lost is not None:
            try:
                self.on_lost(handle, error)
            except Exception:  # noqa: BLE001 (a callback's bug must not break the lock)
                logger.exception("on_lost callback failed for %r", self.resource)
        return error

    def note_failures(self, failures: Sequence[NodeFailure], action: str) -> None:
        """An action that succeeded although some masters failed: say which, and why (one more
        failure there may cost the quorum)."""
        failed = [f for f in failures if f.reason in ("timeout", "error")]
        handle = self.handle()
        if failed and handle is not None:
            notify(self.observer, "masters_failed", handle, action=action, failures=failed)


class Callers:
    """Who holds what through one ``Lock`` handle: each caller's lease, by its owner (the task
    or thread object), and whether each one's last lease was lost (readable after its release;
    held weakly, so a task or thread that ended is forgotten)."""

    __slots__ = ("_ended", "_leases", "resource")

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._leases: dict[Owner, Lease] = {}
        self._ended: weakref.WeakKeyDictionary[Owner, bool] | None = None

    def get(self, owner: Owner) -> Lease | None:
        return self._leases.get(owner)

    def add(self, owner: Owner, lease: Lease) -> None:
        self._leases[owner] = lease

    def detach(self, owner: Owner, action: str) -> Lease:
        lease = self._leases.pop(owner, None)
        if lease is None:
            holders = ", ".join(describe(o) for o in list(self._leases)) or "nobody"
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it is not acquired by "
                f"{describe(owner)} through this object (held through it by: {holders}); only "
                f"the thread or task that acquired a lock may release it"
            )
        return lease

    def held(self, owner: Owner, action: str) -> Lease:
        """``owner``'s lease, or RuntimeError saying why it has none to ``action``."""
        lease = self._leases.get(owner)
        if lease is None:
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it is not acquired by "
                f"{describe(owner)} through this object"
            )
        if lease.pid != process.pid():
            raise RuntimeError(
                f"cannot {action} lock {self.resource!r}: it was acquired by process "
                f"{lease.pid}, and a forked child does not hold its parent's locks"
            )
        return lease

    def ended(self, owner: Owner, lease: Lease) -> None:
        if self._ended is None:
            self._ended = weakref.WeakKeyDictionary()
        self._ended[owner] = lease.lost

    def was_lost(self, owner: Owner) -> bool:
        return bool(self._ended and self._ended.get(owner, False))
