"""django-redlock: safe mutual exclusion across processes and machines (Redlock over N masters).

from django_redlock import redlock

with redlock("invoice:42", ttl=10, wait=5) as lock:
    ...

Importing this package reads no settings and connects to nothing; the Django surfaces
(``lock_view``, ``GuardedCommandMixin``, ``guard_command``, ``fenced_update``) are imported from
here on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .engine import (
    ExtensionLimit,
    Lock,
    LockContended,
    LockLost,
    LockNotAcquired,
    NotLocked,
    Overloaded,
    QuorumUnavailable,
)
from .engine.locking import locking

if TYPE_CHECKING:
    from .commands import GuardedCommandMixin, guard_command
    from .decorators import lock_view
    from .engine.redlock import Holder, Redlock
    from .fencing import fenced_update
    from .leadership import leader
    from .locks import DjangoLock
    from .transactions import CommitRefused

__all__ = [
    "CommitRefused",
    "ExtensionLimit",
    "GuardedCommandMixin",
    "LockContended",
    "LockLost",
    "LockNotAcquired",
    "NotLocked",
    "Overloaded",
    "QuorumUnavailable",
    "assert_locked",
    "fenced_update",
    "guard_command",
    "holder",
    "leader",
    "is_locked",
    "lock_view",
    "locked",
    "redlock",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The Django surfaces, imported on first use (``from django_redlock import lock_view``): they
#: import Django's request and command machinery, which a plain ``redlock()`` user does not need.
_LAZY = {
    "lock_view": "decorators",
    "GuardedCommandMixin": "commands",
    "guard_command": "commands",
    "fenced_update": "fencing",
    "leader": "leadership",
    "CommitRefused": "transactions",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def redlock(
    *resources: str,
    ttl: float | None = None,
    wait: float | None = None,
    label: str | None = None,
    auto_extend: bool = False,
    max_extensions: int | None = None,
    max_hold: float | None = None,
    reentrant: bool = False,
    on_lost: Callable[[Lock, LockLost], None] | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    limit: int | None = None,
    shared: bool = False,
    db_guard: bool = True,
    template: str | None = None,
    release_before_commit: bool = False,
) -> Lock:
    """A lock on ``resources`` over the masters of ``settings.REDLOCK``: one resource, or
    several (all of them or none, on each master: no deadlock whatever the order).

    Use it as ``with redlock(...) as lock:`` or ``async with``. ``ttl`` (seconds) is the lease and
    ``wait`` (seconds) how long to keep trying when another owner holds it; both default to the
    setting. Leaving the block releases the lock on every master. Raises ``LockContended`` or
    ``QuorumUnavailable`` (both ``LockNotAcquired``) when it cannot be acquired, and ``LockLost``
    on leaving a block that outlived its lease (``release()`` too, when no quorum confirmed it).

    ``auto_extend=True`` renews the lease in the background until the block ends (capped by
    ``max_extensions`` / ``max_hold``); ``reentrant=True`` lets the owning thread or task enter
    it again; ``on_lost(lock, error)`` is called when the lease is lost while held;
    ``at_least``/``at_most`` (seconds) keep a finished lock held until ``at_least`` after it was
    taken, and never let it reach past ``at_most`` (see ``docs/jobs.md``). ``lock.fence``
    is a fencing token that strictly increases per resource (``lock.fences`` for several).

    ``limit=N`` makes it one of N permits of a semaphore (each an ordinary lease; see
    docs/permits.md); ``shared=True`` a reader, beside other readers and excluded by a writer
    (the plain lock on the same name).

    ``db_guard`` (on by default): once the lease is lost or its validity is over, the block's
    next database query raises ``LockLost`` before it reaches the database, and open ``atomic``
    blocks are marked for rollback (see ``django_redlock.dbguard``).

    Inside a transaction (an ``atomic`` block open when the lock is taken: ``ATOMIC_REQUESTS``,
    a caller's ``atomic``), leaving the block does not release the lock yet: it is released when
    that transaction ends, after its ``COMMIT`` or ``ROLLBACK``, and a commit after the lease
    was lost is refused (rolled back, ``CommitRefused``); see ``django_redlock.transactions``.
    ``release_before_commit=True`` releases it at the block's end instead: the next holder may
    then read the data as it was before our commit.

    ``template``: the resource as written before formatting (``"invoice:{id}"``), the label of
    the per-template wait and hold histograms (``django_redlock.metrics``); ``@locked`` and
    ``lock_view`` pass their templates, guarded commands their command's lock.
    """
    if (
        auto_extend is False
        and reentrant is False
        and shared is False
        and limit is None
        and on_lost is None
        and max_extensions is None
        and max_hold is None
        and at_least is None
        and at_most is None
    ):  # (every such option at its default, as for most locks: 14.5k instructions a lock fewer)
        return _plain()(resources, ttl, wait, label, db_guard, template, release_before_commit)
    return _with_options()(
        resources, ttl, wait, label, auto_extend, max_extensions, max_hold, reentrant, on_lost,
        at_least, at_most, limit, shared, db_guard, template, release_before_commit,
    )  # fmt: skip


@cache
def _plain() -> Callable[..., DjangoLock]:
    """``locks.plain``, imported on first use (importing this package imports no Django
    machinery) and kept: importing it in every call cost 10k instructions a lock (2.4%)."""
    from .locks import plain

    return plain


@cache
def _with_options() -> Callable[..., DjangoLock]:
    """``locks.with_options``, imported on first use (as ``_plain``)."""
    from .locks import with_options

    return with_options


def locked(*resources: str, **options: Any) -> Callable[[F], F]:
    """A decorator for any function, sync or async (a service function, a Celery task): run it
    holding ``redlock(*resources, **options)``, each resource formatted from the call's
    arguments::

        @locked("report:{user_id}", ttl=60, wait=5)
        def build_report(user_id: int) -> None: ...

    Settings are read at call time, never when the module is imported. Takes the options of
    ``redlock()``, ``db_guard`` included."""
    if all(isinstance(r, str) for r in resources):
        options.setdefault("template", " + ".join(resources))
    # locking() only calls .lock() on what it is given: redlock() stands in for an engine's.
    return locking(lambda: cast("Redlock", _DjangoLocks), resources, options)


class _DjangoLocks:
    """What ``locked()`` makes its locks with: ``redlock()`` (the settings' masters, guarded)."""

    lock = staticmethod(redlock)


def assert_locked(resource: str) -> None:
    """Raise ``NotLocked`` unless the calling thread or task holds ``resource`` now (``LockLost``
    if its lease ran out): for code that must only ever run guarded. Local: no network call."""
    from .conf import get_redlock

    get_redlock().assert_locked(resource)


def holder(resource: str) -> Holder | None:
    """Who holds ``resource`` now, as a quorum of masters says (host, pid, thread, task,
    label, since); None if nobody holds it. Raises ``QuorumUnavailable`` when too few masters
    answered to tell."""
    from .conf import get_redlock

    return get_redlock().holder(resource)


def is_locked(resource: str) -> bool:
    """Whether anyone holds ``resource`` on a quorum of masters (one round). Raises
    ``QuorumUnavailable`` when too few masters answered to tell."""
    return holder(resource) is not None
