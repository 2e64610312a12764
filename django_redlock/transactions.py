"""Held until the transaction ends: a lock taken inside an ``atomic`` block is released when that
block's outermost transaction ends (after ``COMMIT`` or ``ROLLBACK``), not when its own block
ends.

Why: ``ATOMIC_REQUESTS`` wraps a ``lock_view`` view in ``transaction.atomic``, and a service
function locks inside its caller's ``atomic``. Released at its block's end, the lock is free
before our ``COMMIT``: the next holder reads the row as it was before our write, and one of the
two updates is lost. So when a lock's block ends (``with``, ``@locked``, ``lock_view``, a guarded
command, ``RedlockTask``'s run lock, ``release()``) while a database connection that was inside
an ``atomic`` block when the lock was taken is still inside it, the lock waits for that
transaction: it stays held (renewed if it was auto-extended; else for its lease) and is released
right after the connection's ``commit()`` or ``rollback()`` (or ``close()``, whose server rolls
back). Only the outermost transaction counts: savepoints (nested ``atomic``) commit nothing.

The commit is checked: if a waiting lease is lost or its validity is over when the connection
commits, the transaction is rolled back instead and ``CommitRefused`` (a ``LockLost``) is raised.
The window left is the time between that check (a clock read, no I/O) and the server applying the
``COMMIT``: a pause of this process, or a slow network, in between. Only a fence closes it
(``FencedModel``); see docs/stale-writers.md.

How: Django ends an atomic block's outermost transaction with ``connection.commit()`` or
``connection.rollback()`` (``Atomic.__exit__``; also the caller's own when autocommit is off),
never through ``execute`` (so not through the DB guard's execute wrapper), and ``on_commit``
callbacks neither run on rollback nor survive a savepoint rolled back around them. So the
connection's own ``commit``, ``rollback`` and ``close`` are wrapped, on the connection object
(``connection.__dict__``), the first time a lock is taken inside one of its transactions; from
then on they cost a dict lookup when no lock waits.

Which connections: every connection the acquiring thread has connected (``connection_created``:
Django's connections are per thread) that is inside an ``atomic`` block when the lock is taken;
the lock waits for all of them. Until any connection of this process has connected, taking a
lock looks at none: a process that does not use the database pays one global read per
acquisition. (A connection shared across threads, as ``LiveServerTestCase`` shares an in-memory
SQLite one, is seen by the thread that connected it only.)

Not covered, and why:

- Django's ``TestCase`` (and pytest-django's ``django_db`` without ``transaction=True``) runs each
  test in a transaction that is never committed: a lock taken there is released at its block's
  end, as before (there is no commit to cover). ``TransactionTestCase`` commits, and is covered.
- Async locks (``async with redlock()``): Django's connections are per thread and an ``atomic``
  block cannot span awaits, so the event loop's thread is never inside one; an ``atomic`` run
  through ``sync_to_async`` belongs to another thread, whose transaction the async lock cannot
  see. Lock inside the synchronous function instead (or ``lock_view(atomic=True)``).
- Autocommit turned off by hand (``transaction.set_autocommit(False)``) with no ``atomic`` block
  open when the lock is taken.
- Readers (``shared=True``): released at their block's end; their reads are done by then, and
  the same thread may then take the writer of the same name.

Shown: the lock's value says ``"txn":true`` (``values.transaction_value``, written by the
acquisition), so the admin page and ``redlock_status`` show "held until its transaction ends".

``release_before_commit=True`` (on ``redlock()``, ``@locked``, ``lock_view``, guarded commands
and ``RedlockTask``) turns this off: the lock is released at its block's end, before the
enclosing transaction commits, as it was before.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from types import MethodType
from typing import Any, Protocol

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from . import dbguard
from .engine import LockLost
from .engine.base import process
from .engine.leases.callers import Callers
from .engine.leases.leases import Lease, Owner


class _Layer(Protocol):
    @property
    def db_guard(self) -> bool: ...


class DjangoLock(Protocol):
    """What this module needs of ``locks.DjangoLock`` (named here: ``locks`` imports us)."""

    _callers: Callers
    resource: str
    resources: tuple[str, ...]

    @property
    def _layer(self) -> _Layer: ...

    def _release_waited(self, owner: Owner, lease: Lease) -> None: ...


logger = logging.getLogger("django_redlock")

#: Where a connection keeps the holds waiting for its current transaction (in its ``__dict__``).
_WAITING = "_django_redlock_waiting"

#: Whether any database connection of this process has connected: until then no connection
#: can be inside a transaction, and an acquisition looks at none. None until ``install()``
#: (``AppConfig.ready()``, else the first acquisition).
databases_used: bool | None = None


class CommitRefused(LockLost):
    """A transaction that a lock waited for was about to commit after the lock's lease was lost
    or its validity was over: it was rolled back instead."""


class Hold:
    """A lease taken inside one or more transactions."""

    __slots__ = ("handle", "lease", "lock", "open", "owner", "waiting")

    def __init__(self, lock: DjangoLock, owner: Owner, lease: Lease, open_count: int) -> None:
        self.lock = lock  # the handle that will release it (the last one to hold it)
        self.handle = lock  # the handle that took it: the lease's, kept alive (held weakly)
        self.owner = owner
        self.lease = lease
        self.open = open_count  # how many of the transactions it was taken in are still open
        self.waiting = False  # its block ended: released when ``open`` reaches 0


#: The holds, by lease. Empty in a process that never took a lock inside a transaction, and
#: between such locks: releasing looks here only when it is not.
holds: dict[Lease, Hold] = {}

# A forked child holds none of its parent's locks (``engine.process``): it must neither take
# one of them again nor release it when an inherited connection's transaction ends.
os.register_at_fork(after_in_child=holds.clear)


def _on_connection_created(sender: object, connection: BaseDatabaseWrapper, **_: Any) -> None:
    global databases_used
    databases_used = True
    _remember(connection)


#: The connection objects each thread has connected (Django's are per thread): what ``inside``
#: looks at. (``connections.all(initialized_only=True)`` cost 16 us a call, through asgiref's
#: ``Local``; this, well under one.)
_threads = threading.local()


def _remember(connection: BaseDatabaseWrapper) -> None:
    known: list[BaseDatabaseWrapper] | None = getattr(_threads, "connections", None)
    if known is None:
        known = _threads.connections = []
    if not any(c is connection for c in known):  # (connected again: the same object)
        known.append(connection)


def install() -> None:
    """Notice the first connection (``AppConfig.ready()``; idempotent). The calling thread's
    connections opened before (an earlier app's ``ready()``) are noticed here too."""
    global databases_used
    connection_created.connect(
        _on_connection_created, weak=False, dispatch_uid="django_redlock.transactions"
    )
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            databases_used = True
            _remember(connection)
    if databases_used is None:
        databases_used = False


def inside() -> list[BaseDatabaseWrapper]:
    """The connections of this thread inside a transaction (not a ``TestCase``'s, which never
    commits)."""
    if databases_used is None:
        install()  # the app is not in INSTALLED_APPS: its ready() did not
    known: list[BaseDatabaseWrapper] | None = getattr(_threads, "connections", None)
    if not known:
        return []
    return [
        c
        for c in known
        if c.in_atomic_block
        and not (c.atomic_blocks and getattr(c.atomic_blocks[0], "_from_testcase", False))
    ]


def taken(lock: DjangoLock, owner: Owner, lease: Lease) -> None:
    """``lease`` was just taken: if a connection of this thread is inside a transaction, it
    will wait for its end."""
    inside_now = inside()
    if not inside_now:
        return
    hold = Hold(lock, owner, lease, len(inside_now))
    for connection in inside_now:
        _waiting_on(connection).append(hold)
    holds[lease] = hold


class _Waiting:
    """What waits for one connection's current transaction (kept in its ``__dict__``; apart
    from the connection, so that its finalizer can see it once the connection is gone)."""

    __slots__ = ("holds",)

    def __init__(self) -> None:
        self.holds: list[Hold] | None = None


def _waiting_of(connection: BaseDatabaseWrapper) -> list[Hold] | None:
    box: _Waiting | None = connection.__dict__.get(_WAITING)
    return None if box is None else box.holds


def _waiting_on(connection: BaseDatabaseWrapper) -> list[Hold]:
    box: _Waiting | None = connection.__dict__.get(_WAITING)
    if box is None:  # once per connection object
        box = connection.__dict__[_WAITING] = _Waiting()
        connection.commit = MethodType(_commit, connection)  # type: ignore[method-assign]
        connection.rollback = MethodType(_rollback, connection)  # type: ignore[method-assign]
        connection.close = MethodType(_close, connection)  # type: ignore[method-assign]
        weakref.finalize(connection, _abandoned, box)
    if box.holds is None:
        box.holds = []
    return box.holds


def _abandoned(box: _Waiting) -> None:
    """A connection was dropped with a transaction open that locks wait for (its thread ended
    without leaving its ``atomic`` block): the database rolls it back as the socket closes, and
    nothing will call its commit or rollback. Its waiting locks are no longer renewed: they
    expire within their lease, and the log says so (no round from a finalizer)."""
    waiting, box.holds = box.holds, None
    for hold in waiting or ():
        hold.open -= 1
        if hold.open > 0:
            continue
        if holds.get(hold.lease) is hold:
            del holds[hold.lease]
        if hold.waiting and not hold.lease.released:
            hold.lease.auto_extend = False
            logger.error(
                "lock %r waited for a transaction whose connection was dropped without COMMIT "
                "or ROLLBACK (its thread ended inside an atomic block?): no longer renewed, it "
                "expires within its lease",
                hold.lease.resource,
            )


def block_ended(lock: DjangoLock, owner: Owner, lease: Lease) -> bool:
    """The block of ``owner``'s ``lease`` ends: True if it now waits for its transactions (let
    go of by the handle, not released); False to release it now."""
    hold = holds.get(lease)
    if hold is None or hold.open <= 0 or lease.depth != 1 or lease.released:
        return False
    lock._callers.detach(owner, "release", lock.resource)
    lease.depth = 0
    hold.lock = lock
    hold.waiting = True
    dbguard.unguard(lease)  # the block is over: its queries were the block's, not the rest's
    return True


def adopt(lock: DjangoLock, owner: Owner) -> bool:
    """``owner`` takes ``lock`` again inside the transaction its earlier lease on the same
    resources waits for: that lease is held again (no round), as if its block had not ended."""
    for lease, hold in list(holds.items()):
        if (
            hold.waiting
            and hold.owner is owner
            and lease.resources == lock.resources
            and type(hold.lock) is type(lock)
            and not lease.released
            and not lease.check_lost()
        ):
            hold.waiting = False
            hold.lock = lock
            lease.depth = 1
            lock._callers.add(owner, lease)
            if lock._layer.db_guard:
                dbguard.install_here()
                dbguard.guard(lease)
            return True
    return False


def forget(lease: Lease) -> None:
    """``lease`` was released (its block ended after its transactions, or it was let go of
    another way): nothing waits for it."""
    hold = holds.pop(lease, None)
    if hold is not None:
        hold.open = 0


def waiting() -> list[Lease]:
    """The leases of this process whose block ended and which wait for their transaction."""
    return [lease for lease, hold in list(holds.items()) if hold.waiting]


# --- the connection's commit, rollback and close ---------------------------------------------


def _commit(connection: BaseDatabaseWrapper) -> None:
    waiting = _waiting_of(connection)
    if waiting:
        lost = next((h.lease for h in waiting if _lost(h.lease)), None)
        if lost is not None:
            _refuse(connection, lost)
    type(connection).commit(connection)
    _ended(connection, committed=True)


def _lost(lease: Lease) -> bool:
    return not lease.released and lease.check_lost()


def _refuse(connection: BaseDatabaseWrapper, lease: Lease) -> None:
    """Roll back instead of committing (a ``DatabaseError`` would make ``Atomic`` do it, but a
    caller committing by hand would not), then raise."""
    try:
        type(connection).rollback(connection)
    finally:
        _ended(connection, committed=False)
    raise CommitRefused(
        lease.resource,
        f"{lease.lost_message()}: the transaction it waited for was rolled back instead of "
        f"committed",
    )


def _rollback(connection: BaseDatabaseWrapper) -> None:
    try:
        type(connection).rollback(connection)
    finally:
        _ended(connection, committed=False)


def _close(connection: BaseDatabaseWrapper) -> None:
    try:
        type(connection).close(connection)
    finally:
        if _waiting_of(connection) is not None:
            _ended(connection, committed=False)  # the server rolls an open transaction back


def _ended(connection: BaseDatabaseWrapper, *, committed: bool) -> None:
    """The connection's transaction ended: release each lease that waited for it (and for no
    other still open). After a commit, a lease found lost by its release is raised (the commit
    happened: the caller must know that the lock did not cover it), once every lease is
    released; after a rollback nothing was written, and it is only logged."""
    box: _Waiting | None = connection.__dict__.get(_WAITING)
    if box is None:
        return
    waiting, box.holds = box.holds, None
    if not waiting:
        return
    first: LockLost | None = None
    for hold in waiting:
        hold.open -= 1
        if hold.open > 0:
            continue
        if holds.get(hold.lease) is hold:
            del holds[hold.lease]
        if not hold.waiting or hold.lease.released or hold.lease.pid != process.pid:
            continue  # its block is still running (released when it ends), or our parent's
        try:
            hold.lock._release_waited(hold.owner, hold.lease)
        except LockLost as error:
            if error.unconfirmed or not committed:
                logger.warning("release after the transaction of %r: %s", error.resource, error)
            elif first is None:
                first = error
        except Exception:  # a master's bug must not leave the other leases held
            logger.exception("release after the transaction of %r failed", hold.lease.resource)
    if first is not None:
        raise first
