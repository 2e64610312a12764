"""The database guard: a holder whose lease is over cannot reach the database.

A holder paused past its lease (GC, SIGSTOP, a swapped-out VM) wakes up believing it holds the
lock. While it holds a guarded lock (from acquisition to release: a ``with`` block, a function
or generator under ``@locked``, a view under ``lock_view``), the next query it sends raises
``LockLost`` before it reaches the database, and every open ``atomic`` block of the thread is
marked for rollback, so that even a caller who catches the error cannot commit::

    with redlock(f"account:{pk}"):          # guarded by default (db_guard=False to opt out)
        with transaction.atomic():
            account = Account.objects.get(pk=pk)
            ...                             # paused here past the TTL
            account.save()                  # LockLost: the UPDATE never leaves the process

How it works: one ``execute_wrapper`` (``refuse_stale_queries``) sits first on every database
connection (installed on each connection as it connects, and on the calling thread's
connections when a block is entered). It reads a ``ContextVar`` holding the leases of the
guarded blocks around the current code; outside any block that is one lookup. Inside, it
compares each lease's validity deadline with the monotonic clock (no I/O, no round trip): a
lease found lost by the renewal thread (a force release, a failed renewal) or whose validity
ran out refuses the query.

Which queries are "the block's": every query run in the block's context. A ``ContextVar`` is
copied into ``sync_to_async`` (so an async view's ORM calls in the executor thread are guarded)
and into ``asyncio.to_thread``; a thread you start yourself (``threading.Thread``, a bare
``ThreadPoolExecutor``) does not inherit it and is not guarded.

The guard follows the caller, as the lock's ownership does: ``await asyncio.wait_for(
lock.aacquire(), 5)``, ``asyncio.gather(lock.aacquire())``, ``create_task`` and ``shield`` run
the acquisition in a child task, whose copy of the context is thrown away when it ends. So
``aacquire()`` puts a pending entry (``Pending``) into the *calling* task's context when it is
called, the way the engine binds the owner then; the child task's copy holds the same entry,
and taking the lease fills it: the caller's queries are guarded from then on.

Transaction control (``BEGIN``, ``SAVEPOINT``, ``RELEASE SAVEPOINT``, ``ROLLBACK``) is let
through: it writes nothing by itself, and refusing it would leave Django's transaction state
half-changed. ``COMMIT`` is not a query
(Django calls the driver's ``commit()``): a pause between the last query and the commit is the
same window as a query already sent when the lease ran out, which only a fence can close
(``FencedModel``).

Outside Django (settings not configured) the guard does nothing; with no database configured
it guards nothing. The engine's ``Lock`` (``Redlock(...).lock()``) is never guarded: the guard
belongs to the Django layer (``redlock()``, ``@locked``, ``lock_view``, guarded commands).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Coroutine
from contextvars import ContextVar
from time import monotonic
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from .engine import LockLost
from .engine.leases.leases import Lease


class Pending:
    """A guard entry made when an async acquisition is *called*, in the caller's context, and
    filled with the lease when it is taken (perhaps in a child task: ``wait_for``, ``gather``,
    ``create_task``, ``shield``), so that the caller's queries are guarded, as the lease is the
    caller's. Empty, it refuses nothing."""

    __slots__ = ("acquiring", "lease", "lock", "owner")

    def __init__(self, lock: object, owner: object, acquiring: Coroutine[Any, Any, Any]) -> None:
        self.lock = lock
        self.owner = owner
        self.lease: Lease | None = None
        #: The acquisition (weakly: a coroutine never awaited must still be collected).
        self.acquiring = weakref.ref(acquiring)

    def over(self) -> bool:
        """True once the entry guards nothing any more: its lease was released, or its
        acquisition ended (failed, cancelled, never awaited) without one."""
        if self.lease is not None:
            return self.lease.released
        acquiring = self.acquiring()  # (a coroutine's frame is None once it ended)
        return acquiring is None or getattr(acquiring, "cr_frame", True) is None


#: The leases of the guarded blocks around the running code (innermost last), each a ``Lease``
#: or the ``Pending`` entry of an async acquisition.
_guarded: ContextVar[tuple[Lease | Pending, ...]] = ContextVar("django_redlock_guarded", default=())

#: Transaction control: writes nothing by itself, and refusing it would leave Django's
#: transaction bookkeeping half-changed (``atomic`` releases a savepoint after rolling back to it).
_ALWAYS_ALLOWED = ("BEGIN", "ROLLBACK", "SAVEPOINT", "RELEASE")


class QueryRefused(LockLost):
    """The guard refused a query: the lease of a guarded block around it is lost or over."""


def refuse_stale_queries(
    execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: dict[str, Any]
) -> Any:
    """The execute wrapper: pass the query on, unless a guarded lease around it is over."""
    leases = _guarded.get()
    if leases:
        for entry in leases:
            lease = entry.lease if isinstance(entry, Pending) else entry
            if lease is None:
                continue  # an async acquisition not (yet) made: nothing to guard
            if not lease.lost and monotonic() < lease.valid_until:
                continue  # the fast path: one attribute and one clock read per lease
            # A lease whose handle is gone was abandoned (a stream closed from another thread:
            # the engine stops renewing it): it no longer speaks for the code around it.
            if not lease.released and lease.handle() is not None and lease.check_lost():
                _refuse(lease, sql, context)
                break
    return execute(sql, params, many, context)


def _refuse(lease: Lease, sql: Any, context: dict[str, Any]) -> None:
    if isinstance(sql, str) and sql.lstrip()[:9].upper().startswith(_ALWAYS_ALLOWED):
        return
    doomed = {id(c): c for c in connections.all(initialized_only=True)}
    connection = context.get("connection")
    if isinstance(connection, BaseDatabaseWrapper):
        doomed[id(connection)] = connection
    for each in doomed.values():
        if each.in_atomic_block:
            each.set_rollback(True)
    raise QueryRefused(
        lease.resource,
        f"{lease.lost_message()}: the query was refused before it reached the database, and "
        f"any open transaction of this thread is marked for rollback",
    )


def install(connection: BaseDatabaseWrapper) -> None:
    """Put the guard first on ``connection`` (first: ``connection.execute_wrapper()`` removes
    the last wrapper when its block ends, and must remove its own, not ours)."""
    wrappers = connection.execute_wrappers
    if refuse_stale_queries not in wrappers:
        wrappers.insert(0, refuse_stale_queries)


def _on_connection_created(sender: object, connection: BaseDatabaseWrapper, **_: Any) -> None:
    install(connection)


def install_everywhere() -> None:
    """Guard every connection that connects from now on (any thread: the executor threads of
    ``sync_to_async`` included). Called from ``AppConfig.ready()`` and on the first guarded
    block; idempotent."""
    global _everywhere
    if not _everywhere:  # connect() clears the signal's cache even when already connected
        connection_created.connect(
            _on_connection_created, weak=False, dispatch_uid="django_redlock.dbguard"
        )
        _everywhere = True


_everywhere = False


def install_here() -> None:
    """Guard the calling thread's connections, including any opened before the receiver was
    connected (the app not in INSTALLED_APPS, or a query in an earlier app's ``ready()``). Once
    per thread: every connection that connects after that gets the guard from the receiver."""
    if getattr(_checked, "done", False) or not settings.configured:
        return
    install_everywhere()
    for alias in connections:
        install(connections[alias])
    _checked.done = True


_checked = threading.local()


def expect(lock: object, owner: object, acquiring: Coroutine[Any, Any, Any]) -> None:
    """Called when ``owner`` calls ``lock.aacquire()`` (``acquiring``), in its context: the
    entry that ``guard()`` fills when the lease is taken, wherever the acquisition runs."""
    entries = _guarded.get()
    if entries:  # (the usual acquisition has none around it: no scan)
        entries = _live(entries)
    _guarded.set((*entries, Pending(lock, owner, acquiring)))


def _live(entries: tuple[Lease | Pending, ...]) -> tuple[Lease | Pending, ...]:
    """``entries`` less the ``Pending`` ones that are over (so that a task that keeps failing
    to acquire through ``wait_for`` does not pile them up)."""
    if not any(isinstance(e, Pending) and e.over() for e in entries):
        return entries
    return tuple(e for e in entries if not (isinstance(e, Pending) and e.over()))


def guard(lease: Lease, lock: object = None, owner: object = None) -> None:
    """Guard the current context's queries with ``lease`` (taken by ``lock`` for ``owner``)
    until ``unguard(lease)``: in the entry ``expect()`` made for it when the acquisition was
    called (which the caller's context holds too), else in a new one."""
    leases = _guarded.get()
    for entry in reversed(leases):
        if (
            isinstance(entry, Pending)
            and entry.lease is None
            and entry.lock is lock
            and entry.owner is owner
        ):
            entry.lease = lease
            return
    _guarded.set((*leases, lease))


def unguard(lease: Lease) -> None:
    """Stop guarding with ``lease`` (its innermost entry). Called from another context (a stream
    finished by the server in another thread) it finds nothing to remove: the entry left behind
    is a released lease, which never refuses a query."""
    leases = _guarded.get()
    if leases and _guards(leases[-1], lease):  # the innermost: the usual block's end
        _guarded.set(leases[:-1])
        return
    for i in range(len(leases) - 1, -1, -1):
        if _guards(leases[i], lease):
            _guarded.set(leases[:i] + leases[i + 1 :])
            return


def _guards(entry: Lease | Pending, lease: Lease) -> bool:
    return entry is lease or (isinstance(entry, Pending) and entry.lease is lease)
