"""Run a management command at most once at a time across all servers (cron on every host).

For commands you write, put ``GuardedCommandMixin`` before ``BaseCommand``::

    class Command(GuardedCommandMixin, BaseCommand):
        lock_ttl = 60          # optional; the lease is auto-extended while the command runs

For any installed command (third-party ones too), ``manage.py redlock_run -- <command> [args]``.
Both use ``guard_command``, which:

- takes the lock ``command:<name>`` (or the key you give), auto-extended while the command runs;
- when another process holds it, raises ``CommandError`` (exit status ``EXIT_HELD`` = 75,
  EX_TEMPFAIL) naming the holder, before the command starts; ``EXIT_UNAVAILABLE`` = 69 when no
  quorum of masters answers. A cron wrapper can tell "skipped" from "failed" by the status;
- with ``at_least``, a run that ends sooner leaves the lock held, unrenewed, until ``at_least``
  after it was taken: the same cron line on a host whose clock is up to that late finds it
  taken and skips. With ``at_most``, renewal stops then (a hung run frees the slot), which is
  reported as a lost lease (below);
- when the lease is lost mid-run (a master flushed, a force release, a pause longer than the
  lease), writes a warning to stderr at once and, after the command finishes, raises
  ``CommandError`` with a report (exit status ``EXIT_LOST`` = 70). The command is not interrupted:
  stopping arbitrary code halfway is worse than finishing and saying that exclusivity was broken.

The lock is re-entrant for the process that holds it, so ``redlock_run -- nightly_report`` of a
command that is itself guarded on the same key runs it once, under one lock. The inner guard's
``at_least``/``at_most`` are kept by that lock (the strictest of both entries: ``engine.bounds``),
so a command's own ``lock_at_least`` holds under ``redlock_run`` as it does alone.

Why no setting listing commands that are always guarded: Django has no hook that runs around every
command. It would take monkey-patching ``BaseCommand.execute`` or ``call_command`` (which changes
every command of every app, including the ones Django runs internally such as ``migrate`` in
tests), or shadowing each command with a same-named one in an app listed first (impossible to
derive from a setting: Django finds commands by their file names). A cron line that says
``manage.py redlock_run -- clearsessions`` is explicit and needs neither.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TextIO

import redis
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from . import conf, redlock
from .contrib import prometheus
from .dbguard import QueryRefused
from .engine import Lock, LockContended, LockLost, QuorumUnavailable
from .keys import bounded_resource
from .operations.display import printable

__all__ = [
    "EXIT_HELD",
    "EXIT_LOST",
    "EXIT_UNAVAILABLE",
    "GuardedCommandMixin",
    "command_resource",
    "guard_command",
]

EXIT_UNAVAILABLE = 69  # sysexits EX_UNAVAILABLE
EXIT_LOST = 70  # sysexits EX_SOFTWARE
EXIT_HELD = 75  # sysexits EX_TEMPFAIL: try again later


def command_resource(name: str) -> str:
    """The default lock of a command: ``command:<name>``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"command name must be a non-empty str, got {name!r}")
    return bounded_resource(f"command:{name}")


@contextlib.contextmanager
def guard_command(
    name: str,
    *,
    key: str | tuple[str, ...] | None = None,
    ttl: float | None = None,
    wait: float = 0.0,
    label: str | None = None,
    stderr: TextIO | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    limit: int | None = None,
    release_before_commit: bool = False,
) -> Iterator[Lock]:
    """Hold the lock of command ``name`` (``key``, default ``command:<name>``; a tuple of names
    locks all of them, as one lock) around the block; see the module docstring for the errors
    and exit statuses. ``at_least`` (seconds): a run that ends sooner keeps the lock, unrenewed,
    until then, so that the same cron line on a host whose clock is late skips (75);
    ``at_most``: renewal stops then, the lock is free, and the run is told (70). ``limit=N``:
    one of N permits instead (at most N runs at once; not re-entrant). Run inside a transaction
    (``call_command`` in an ``atomic`` block), the lock is held until that transaction ends
    unless ``release_before_commit=True`` (``django_redlock.transactions``)."""
    resources: tuple[str, ...]
    if key is None:
        resources = (command_resource(name),)
    elif isinstance(key, str):
        resources = (bounded_resource(key),)
    else:
        resources = tuple(bounded_resource(k) for k in key)
    resource = " + ".join(resources)
    began = time.monotonic()
    lost_after: list[float] = []
    ran: list[float] = []  # how long it ran, once it has (metrics)

    def on_lost(lock: Lock, error: LockLost) -> None:
        # Called from the renewal thread: say it now, the command may run for hours yet.
        lost_after.append(time.monotonic() - began)
        out = stderr or sys.stderr
        out.write(
            f"WARNING: {name}: lost lock {resource!r} after {lost_after[0]:.1f}s: {error}. "
            f"The command keeps running until its next database query (refused), but another "
            f"process may now run it too.\n"
        )
        out.flush()

    lock = redlock(
        *resources,
        ttl=ttl,
        wait=wait,
        label=label or f"manage.py {name}",
        auto_extend=True,
        reentrant=limit is None,
        on_lost=on_lost,
        at_least=at_least,
        at_most=at_most,
        limit=limit,
        template=resource,  # bounded: one per command (or per key the command names)
        release_before_commit=release_before_commit,
    )
    try:
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(lock)
            except LockContended as error:
                prometheus.job(name, "skipped")
                held_by = (
                    f"all {limit} permits are held"
                    if limit is not None
                    else f"is held by another process ({_holder(resources[0])})"
                )
                raise CommandError(
                    f"{name} not started: lock {resource!r} {held_by}; waited {wait:g}s: {error}",
                    returncode=EXIT_HELD,
                ) from error
            except ValueError as error:
                # Bounds that contradict the lock it re-enters (``redlock_run --at-least 10``
                # of a command whose own ``lock_at_most`` is 2): a usage error, not a traceback.
                raise CommandError(f"{name} not started: {error}", returncode=2) from error
            except QuorumUnavailable as error:
                prometheus.job(name, "unavailable")
                raise CommandError(
                    f"{name} not started: no quorum of lock masters for {resource!r}: {error}",
                    returncode=EXIT_UNAVAILABLE,
                ) from error
            if lock.hold_count == 1:  # re-entered by an inner guard: counted by the outer one
                held.callback(lambda: ran.append(time.monotonic() - began))
            yield lock
    except LockLost as error:
        if error.resource != resource or not lost_after:
            raise  # another lock of the command's own: not ours to report
        prometheus.job(name, "lost", time.monotonic() - began)
        if isinstance(error, QueryRefused):  # the DB guard stopped it at its next query
            raise CommandError(
                f"{name} stopped after {time.monotonic() - began:.1f}s: its lock {resource!r} "
                f"was lost after {lost_after[0]:.1f}s, and its next database query was refused "
                f"before reaching the database: {error}. Check whether another process ran "
                f"{name} meanwhile.",
                returncode=EXIT_LOST,
            ) from error
        raise CommandError(
            f"{name} finished after {time.monotonic() - began:.1f}s, but its lock {resource!r} "
            f"was lost after {lost_after[0]:.1f}s: {error}. Exclusivity was not guaranteed for "
            f"the rest of the run: check whether another process ran {name} meanwhile.",
            returncode=EXIT_LOST,
        ) from error
    finally:
        if ran and not lost_after:
            prometheus.job(name, "ran", ran[0])


def _holder(resource: str) -> str:
    """Who holds ``resource``, as its holder wrote it (host, pid, label, age), best effort."""
    from .conf import get_redlock
    from .operations.inventory import inspect

    try:
        held = inspect(get_redlock(), resource)
    except (redis.RedisError, OSError) as exc:
        return f"holder unknown: {type(exc).__name__}"
    if held is None:
        return "it was released just now"
    age = f" for {time.time() - held.owner.since:.0f}s" if held.owner.since else ""
    owner = printable(str(held.owner))  # another holder's label may carry control characters
    return f"held by {owner}{age}, on {held.held_on} of {held.node_count} masters"


if TYPE_CHECKING:
    _CommandBase = BaseCommand
else:
    _CommandBase = object


class GuardedCommandMixin(_CommandBase):
    """Run this command under its lock: ``class Command(GuardedCommandMixin, BaseCommand)``.

    Set ``lock_key`` (default ``command:<name>``; a tuple of names locks all of them as one
    lock), ``lock_ttl`` (default ``REDLOCK["TTL"]``,
    auto-extended), ``lock_wait`` (default 0: skip at once when another process runs it),
    ``lock_limit`` (at most that many runs at once: a semaphore; default one) and
    ``lock_at_least`` / ``lock_at_most`` (seconds; see ``guard_command``), and
    ``lock_release_before_commit`` (default False: run inside a transaction, the lock is held
    until it ends).
    Defines no ``check()``: that would shadow Django's system checks.
    """

    lock_key: str | tuple[str, ...] | None = None
    lock_ttl: float | None = None
    lock_wait: float = 0.0
    lock_at_least: float | None = None
    lock_at_most: float | None = None
    #: At most this many runs at once (a semaphore's permits) instead of one; None: one.
    lock_limit: int | None = None
    #: True: release the lock when the command ends even inside a transaction, before it commits.
    lock_release_before_commit: bool = False

    def execute(self, *args: Any, **options: Any) -> str | None:
        name = type(self).__module__.rpartition(".")[2]
        try:
            conf.get_config()
        except ImproperlyConfigured as exc:
            # The lock is taken before Django's own execute() would run the system checks: say
            # what they say (SystemCheckError: printed without a traceback, exit status 1).
            self.check()
            raise CommandError(f"REDLOCK setting: {exc}") from exc
        with guard_command(
            name,
            key=self.lock_key,
            ttl=self.lock_ttl,
            wait=self.lock_wait,
            stderr=options.get("stderr"),
            at_least=self.lock_at_least,
            at_most=self.lock_at_most,
            limit=self.lock_limit,
            release_before_commit=self.lock_release_before_commit,
        ):
            return super().execute(*args, **options)
