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
from collections.abc import Callable
from contextvars import ContextVar
from time import monotonic
from typing import Any

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from .engine import LockLost
from .engine.leases import Lease

#: The leases of the guarded blocks around the running code (innermost last).
_guarded: ContextVar[tuple[Lease, ...]] = ContextVar("django_redlock_guarded", default=())

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
        for lease in leases:
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


def guard(lease: Lease) -> None:
    """Guard the current context's queries with ``lease`` until ``unguard(lease)``."""
    _guarded.set((*_guarded.get(), lease))


def unguard(lease: Lease) -> None:
    """Stop guarding with ``lease`` (its innermost entry). Called from another context (a stream
    finished by the server in another thread) it finds nothing to remove: the entry left behind
    is a released lease, which never refuses a query."""
    leases = _guarded.get()
    if leases and leases[-1] is lease:  # the innermost: the usual block's end
        _guarded.set(leases[:-1])
        return
    for i in range(len(leases) - 1, -1, -1):
        if leases[i] is lease:
            _guarded.set(leases[:i] + leases[i + 1 :])
            return
