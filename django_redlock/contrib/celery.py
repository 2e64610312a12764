"""Celery tasks that run once per key, across every worker: ``RedlockTask`` (the ``celery`` extra).

::

    @app.task(base=RedlockTask, lock_key="report:{user_id}", lock_ttl=10)
    def build_report(user_id: int) -> None: ...

- **At run time** the task runs holding the lock ``lock_key`` (formatted from its arguments),
  renewed while it runs (``lock_ttl`` is the lease: a worker killed with ``kill -9`` frees the key
  within it). When the key is busy (held by another run, or by any other code): ``lock_busy =
  "skip"`` (the default: the task returns None), ``"retry"`` (``self.retry`` after
  ``lock_retry_countdown`` seconds, as Celery's own retries count), or ``"wait"`` (up to
  ``lock_wait`` seconds, then skip). A run lock held under the task's *own* id is a run of this
  very task whose worker died (its message delivered again: ``acks_late`` with
  ``reject_on_worker_lost``) or that is ending (a retry sent before its lock was released): the
  run waits for it (its lease lapses within ``lock_ttl``), and never skips itself; a second
  delivery of a message whose run is alive, or has just run (its *done* marker), does nothing
  (Celery's ``Ignore``: that run's result stands).
- **Unique at enqueue** (``lock_unique = True``, the default): ``delay()`` / ``apply_async()``
  while a task with the same key is queued or running publishes nothing and returns that task's
  ``AsyncResult`` (the same id for every caller), or raises ``AlreadyQueued`` with
  ``lock_raise_on_duplicate = True``. A call whose id was fixed before it (``task_id=``, a member
  of a group or chord, a step of a chain) or that hangs more work on its message (``link``,
  ``link_error``) cannot be answered with another task's id: its duplicate raises
  ``AlreadyQueued`` whatever the option says.

Two leases per task, because tokens never leave the process that holds them, and the enqueuer and
the worker are different processes: a *queued* marker ``queued:<key>`` taken at enqueue (its label
names the task id, so a duplicate can return it; it lives until the task's ``eta``/``countdown``
plus ``lock_queue_timeout``, after which a message the broker lost frees the key), and the *run*
lock ``<key>``, taken by the worker, which then removes the marker by compare-and-delete of the
exact value naming its task id (never by force). Only the run lock is held while the task works,
under a short renewed lease: a crashed worker blocks the key for ``lock_ttl``, not for an hour. A
task the worker discards without calling it (revoked, expired) has its marker removed the same way
(Celery's ``task_revoked`` signal, in the worker).

Options are checked when Celery builds the task class (at decoration when the app is finalized,
as in a worker; else when the app finalizes, before any task is sent): a ``lock_key`` naming an
argument the task does not have raises ``ValueError`` then. A ``task_id``, ``countdown``, ``eta``
or ``expires`` a marker cannot hold is a ``ValueError`` at ``apply_async``, before any network
call.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import numbers
import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar

from celery import Task
from celery.exceptions import Ignore, Reject, Retry
from celery.result import AsyncResult
from celery.signals import task_revoked
from celery.utils.time import maybe_iso8601, maybe_make_aware
from kombu.utils.uuid import uuid

from ..engine import LockContended, LockLost, QuorumUnavailable
from ..engine.base import protocol
from ..engine.base.values import UnreadableValue, parse_value
from ..engine.locking import resources_of
from ..engine.running.drivers import fan_out
from ..keys import bounded_resource
from ..locks import DjangoLock, layer
from . import prometheus

__all__ = ["AlreadyQueued", "RedlockTask"]

logger = logging.getLogger("django_redlock")

BUSY_CHOICES = ("skip", "retry", "wait")
#: How many times to read a key whose holder some masters' silence leaves unknown.
UNKNOWN_TRIES = 5
#: How the locks of a task name it (their label, shown by the admin and ``redlock_status``): one
#: of these, then the task id as it is, to the end of the label: any id reads back, spaces too.
RUN_LABEL = "celery task: "
QUEUED_LABEL = "celery task queued: "
DONE_LABEL = "celery task done: "
#: The longest task id a lock's label can name (``protocol.MAX_LABEL_LENGTH`` less the prefix).
MAX_TASK_ID_LENGTH = protocol.MAX_LABEL_LENGTH - len(QUEUED_LABEL)
#: A run that finds its own task id holding the run lock waits up to this many ``lock_ttl``: a
#: dead run's lease lapses within one; the second is room for a loaded worker.
OWN_RUN_WAIT_LEASES = 2.0
#: Options that fix the new task's id before the call, or hang more work on its message: a
#: duplicate cannot be answered with another task's id for them (that id is not the one the
#: caller's group, chord, chain or callbacks wait for).
BOUND_OPTIONS = ("group_id", "chord", "chain", "link", "link_error")


class AlreadyQueued(Exception):  # noqa: N818 (celery-once's name, for those who know it)
    """``delay()`` of a task whose key is already queued or running (``lock_raise_on_duplicate``,
    or a call whose own id was fixed: ``because`` says how); ``task_id`` is that task's id."""

    def __init__(self, key: str, task_id: str, because: str = "") -> None:
        self.key = key
        self.task_id = task_id
        self.because = because
        super().__init__(key, task_id, because)

    def __str__(self) -> str:
        message = f"a task with key {self.key!r} is already queued or running: {self.task_id}"
        return f"{message}; {self.because}" if self.because else message


class _SameTaskRan(Exception):
    """Another delivery of this very task's message runs it now (``"running"``: it still holds
    and renews the run lock after the wait) or has run it (``"ran"``: it left its done marker)."""

    def __init__(self, how: str) -> None:
        self.how = how
        super().__init__(how)


class RedlockTask(Task):  # type: ignore[misc]
    """A Celery task base class: see the module docstring. Options, set on ``@app.task``:
    ``lock_key`` (required: a template over the task's arguments), ``lock_ttl`` (seconds,
    default 10), ``lock_busy`` ("skip", "retry", "wait"), ``lock_wait``,
    ``lock_retry_countdown``, ``lock_unique``, ``lock_raise_on_duplicate``,
    ``lock_queue_timeout`` (seconds, default 3600)."""

    abstract = True
    lock_key: ClassVar[str | None] = None
    lock_ttl: ClassVar[float] = 10.0
    lock_busy: ClassVar[str] = "skip"
    lock_wait: ClassVar[float] = 10.0
    lock_retry_countdown: ClassVar[float] = 5.0
    lock_unique: ClassVar[bool] = True
    lock_raise_on_duplicate: ClassVar[bool] = False
    lock_queue_timeout: ClassVar[float] = 3600.0
    #: True: a task called inside a transaction (``task()`` in an ``atomic`` block) releases its
    #: run lock when it returns, before that transaction commits. By default the lock is held
    #: until the transaction ends (``django_redlock.transactions``).
    lock_release_before_commit: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if run is None:
            return  # an intermediate base class: checked when a task is made from it
        func = run.__func__ if isinstance(run, staticmethod) else run
        if not isinstance(cls.lock_key, str) or not cls.lock_key:
            raise ValueError(
                f"task {cls.__name__}: RedlockTask needs lock_key (a str template over the "
                f"task's arguments, e.g. 'report:{{user_id}}'), got {cls.lock_key!r}"
            )
        if cls.lock_busy not in BUSY_CHOICES:
            raise ValueError(f"lock_busy must be one of {BUSY_CHOICES}, got {cls.lock_busy!r}")
        protocol.check_ttl(cls.lock_ttl)
        protocol.check_seconds("lock_wait", cls.lock_wait, allow_zero=True)
        protocol.check_seconds("lock_retry_countdown", cls.lock_retry_countdown, allow_zero=True)
        protocol.check_seconds("lock_queue_timeout", cls.lock_queue_timeout, allow_zero=False)
        layer(False, None, cls.lock_release_before_commit)  # ValueError naming a non-bool
        bound = not isinstance(run, staticmethod)  # bind=True: the task is the first argument
        signature = inspect.signature(func)
        if bound:
            params = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=params)
        cls._lock_resources = staticmethod(resources_of(func, (cls.lock_key,), signature))

    # --- the key ---------------------------------------------------------------------------------

    def lock_resource(self, args: Any, kwargs: Any) -> str:
        """The run lock's resource for a call with ``args`` and ``kwargs``."""
        (key,) = self._lock_resources(tuple(args or ()), dict(kwargs or {}))
        return bounded_resource(key)

    @staticmethod
    def queued_resource(key: str) -> str:
        return bounded_resource(f"queued:{key}")

    @staticmethod
    def done_resource(key: str, task_id: str) -> str:
        return bounded_resource(f"done:{key}:{task_id}")

    def marker_ttl(self, options: Mapping[str, Any]) -> float:
        """How long the queued marker of a task sent with ``options`` must live: until the task
        may start (its ``countdown`` or ``eta``; now without either) plus ``lock_queue_timeout``
        for a worker to take it, but not past its ``expires`` plus that timeout (the worker
        discards it then; the timeout is the room for the worker's clock). ``ValueError``
        naming an option no marker can follow."""
        now = time.time()
        countdown = options.get("countdown")
        if countdown:  # as Celery reads them: a countdown replaces the eta
            starts = _seconds_from_now("countdown", countdown, now, moments=False)
        else:
            starts = _seconds_from_now("eta", options.get("eta"), now, seconds=False)
        expires = _seconds_from_now("expires", options.get("expires", self.expires), now)
        ahead = max(0.0, starts or 0.0)
        if expires is not None:
            ahead = max(0.0, min(ahead, expires))
        ttl = ahead + self.lock_queue_timeout
        if ttl > protocol.MAX_SECONDS:
            raise ValueError(
                f"task {self.name} would start {ahead:.0f} s from now (countdown/eta): its "
                f"queued marker cannot live that long (at most {protocol.MAX_SECONDS:.0f} s with "
                f"lock_queue_timeout)"
            )
        return ttl

    # --- enqueue ---------------------------------------------------------------------------------

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        if not self.lock_unique:
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        from ..conf import get_redlock

        key = self.lock_resource(args, kwargs)
        queued = self.queued_resource(key)
        fixed = bool(task_id)  # (an empty id is no id: Celery makes one, as we do)
        task_id = check_task_id(task_id) if task_id else uuid()
        ttl = self.marker_ttl(options)
        engine = get_redlock()
        if options.get("retries"):
            # Celery's own retry of a task that ran (same id): it must be sent, whatever holds
            # the key; it is queued again under a fresh marker, which lives until its eta.
            _clear_marker(engine, queued, task_id)
            self._mark_queued(engine, queued, task_id, ttl)
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        bound = [name for name in BOUND_OPTIONS if options.get(name)]
        if fixed:
            bound.append("task_id")
        # The running task first, then the queued one: a caller that took the marker just as a
        # task started holds it for a moment only (it finds that task running, and lets go), so
        # its id must never be the answer while a task runs.
        for _ in range(5):  # a holder gone between our attempt and our look: try again
            running = _task_of(engine, key)
            if running is not None:
                return self._duplicate(key, task_id, running, bound)
            if not self._mark_queued(engine, queued, task_id, ttl):
                existing = _task_of(engine, key) or _task_of(engine, queued)
                if existing is not None:
                    return self._duplicate(key, task_id, existing, bound)
                continue
            running = _task_of(engine, key)  # started between our look and our marker
            if running is not None:
                _clear_marker(engine, queued, task_id)
                return self._duplicate(key, task_id, running, bound)
            try:
                return super().apply_async(args, kwargs, task_id=task_id, **options)
            except BaseException:
                _clear_marker(engine, queued, task_id)
                raise
        raise LockContended(key, f"task key {key!r} is busy, and its holder is not a task")

    def _mark_queued(self, engine: Any, queued: str, task_id: str, ttl: float) -> bool:
        """Take the queued marker for ``task_id`` for ``ttl`` seconds; False if another one
        holds it. The handle is dropped at once: the marker outlives this process's interest in
        it, and lapses after ``ttl`` unless the worker removes it first."""
        marker = engine.lock(queued, ttl=ttl, label=_label(task_id, QUEUED_LABEL))
        try:
            marker.acquire()
        except LockContended:
            return False
        return True

    def _duplicate(self, key: str, task_id: str, existing: str, bound: list[str]) -> AsyncResult:
        """The answer to a call for ``task_id`` while ``existing`` is queued or running: that
        task, unless the caller waits on ``task_id`` itself (``bound``: how it does)."""
        if bound and existing != task_id:
            raise AlreadyQueued(
                key,
                existing,
                f"this call cannot be answered with that task: its own id {task_id} is the one "
                f"its caller waits on ({', '.join(bound)}), and nothing would ever be sent "
                f"under it",
            )
        if self.lock_raise_on_duplicate:
            raise AlreadyQueued(key, existing)
        return self.AsyncResult(existing)

    # --- run -------------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from ..conf import get_redlock

        engine = get_redlock()
        key = self.lock_resource(args, kwargs)
        task_id = self.request.id or self.name
        try:
            lock = self._take_run_lock(engine, key, task_id)
        except LockContended:
            prometheus.job(self.name, "skipped")
            if self.lock_busy == "retry":
                raise self.retry(countdown=self.lock_retry_countdown) from None
            _clear_marker(engine, self.queued_resource(key), task_id)
            logger.info("task %s [%s] skipped: key %r is busy", self.name, task_id, key)
            return None
        except _SameTaskRan as same:
            prometheus.job(self.name, "skipped")
            _clear_marker(engine, self.queued_resource(key), task_id)
            logger.warning(
                "task %s [%s]: key %r: a run of this very task id %s (its message was delivered "
                "twice): this delivery does nothing, that run's result stands",
                self.name,
                task_id,
                key,
                "holds it, and renews it" if same.how == "running" else "has run",
            )
            raise Ignore() from None  # no state of ours: not a success, not a failure
        except QuorumUnavailable:
            prometheus.job(self.name, "unavailable")
            raise
        began = time.monotonic()
        outcome = "ran"
        try:
            with contextlib.ExitStack() as held:
                held.push(lock)  # acquired above: leaving releases it (LockLost if it was lost)
                _clear_marker(engine, self.queued_resource(key), task_id)
                # A message not yet acknowledged while its task runs can be delivered again
                # meanwhile (a broker's visibility timeout): its run leaves a done marker.
                mark_done = self.acks_late or self.request.eta is not None
                try:
                    result = super().__call__(*args, **kwargs)
                except (Retry, Reject):
                    raise  # to be run again: not done
                except Exception:
                    if mark_done:
                        self._mark_done(engine, key, task_id)
                    raise
                if mark_done:
                    self._mark_done(engine, key, task_id)
                return result
        except LockLost:
            outcome = "lost"
            raise
        finally:
            prometheus.job(self.name, outcome, time.monotonic() - began)

    def _take_run_lock(self, engine: Any, key: str, task_id: str) -> Any:
        """The run lock of ``key``, acquired; ``LockContended`` when another holds it (after
        ``lock_wait`` seconds with ``lock_busy="wait"``).

        Held under this task's own id, it is a run of this very task: one whose worker died
        (the message delivered again: ``acks_late`` with ``reject_on_worker_lost``, or Celery's
        ``retry_on_worker_lost``), whose lease lapses within ``lock_ttl``, or one that is ending
        (a retry sent before its run lock was released). Skipping would end the task with the
        body never run; taking the lock over would run it twice if that run is alive. So it
        waits for it, up to ``OWN_RUN_WAIT_LEASES`` leases, marked queued meanwhile (a
        ``delay()`` then keeps answering with this id), and raises ``_SameTaskRan`` if that run
        still renews it then, or if it ended its body (its done marker: ``_mark_done``): a
        second delivery of a message whose run was alive (a broker's visibility timeout, an eta
        past it) must not run the body again once that run is over."""
        try:
            return self._acquired(engine, key, task_id, 0.0)
        except LockContended:
            if not _held_by_run_of(engine, key, task_id):
                if self.lock_busy != "wait":
                    raise
                # Another holder: wait for it. (Not at the first attempt: a run of this id
                # that ends meanwhile must be told apart, by its done marker, below.)
                return self._acquired(engine, key, task_id, self.lock_wait)
        self._mark_queued(engine, self.queued_resource(key), task_id, self.lock_queue_timeout)
        try:
            lock = self._acquired(engine, key, task_id, OWN_RUN_WAIT_LEASES * self.lock_ttl)
        except LockContended:
            if _held_by_run_of(engine, key, task_id):
                raise _SameTaskRan("running") from None
            raise
        if engine.is_locked(self.done_resource(key, task_id)):
            with contextlib.suppress(LockLost):
                lock.release()
            raise _SameTaskRan("ran")
        return lock

    def _mark_done(self, engine: Any, key: str, task_id: str) -> None:
        """Before the run lock is released, at the end of a body that ran (returned or raised;
        not a retry): a marker that this task id has run, for a second delivery of its message
        waiting on the lock (``_take_run_lock``), lapsing after the longest such wait. A
        failure to leave it is logged, never raised over the task's own outcome."""
        marker = engine.lock(
            self.done_resource(key, task_id),
            ttl=OWN_RUN_WAIT_LEASES * self.lock_ttl,
            label=_label(task_id, DONE_LABEL),
        )
        try:
            marker.acquire()
        except LockContended:
            pass  # left already, by a run of this id
        except Exception:
            logger.warning("task %s [%s]: no done marker", self.name, task_id, exc_info=True)

    def _acquired(self, engine: Any, key: str, task_id: str, wait: float) -> Any:
        # The Django layer's handle (unguarded, as the task always ran): called inside a
        # transaction, its run lock waits for that transaction's end (``transactions.py``).
        lock = DjangoLock(
            engine,
            key,
            ttl=self.lock_ttl,
            wait=wait,
            label=_label(task_id, RUN_LABEL),
            auto_extend=True,
        )
        lock._layer = layer(False, None, self.lock_release_before_commit)
        lock.acquire()
        return lock


def check_task_id(task_id: object) -> str:
    """``task_id`` if a lock's label can name it (so that it reads back exactly), else
    ``ValueError`` naming it."""
    if not isinstance(task_id, str):
        raise ValueError(f"task_id must be a str, got {type(task_id).__name__} {task_id!r}")
    if len(task_id) > MAX_TASK_ID_LENGTH:
        raise ValueError(
            f"task_id is {len(task_id)} characters long, more than the {MAX_TASK_ID_LENGTH} a "
            f"RedlockTask's lock can name: {task_id[:40]!r}..."
        )
    try:
        task_id.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"task_id has a lone surrogate at position {exc.start}, which cannot be written to "
            f"Redis: {task_id[:40]!r}"
        ) from None
    return task_id


def _label(task_id: str, prefix: str) -> str | None:
    """The label of a task's queued marker, run lock or done marker (``prefix``); None for an id
    no label can hold (only a message published by other means than ``apply_async`` has one:
    its run is not named)."""
    label = prefix + task_id
    try:
        return protocol.check_label(label)
    except ValueError:
        return None


def _task_named(label: str | None) -> tuple[str, bool] | None:
    """(task id, whether it is a queued marker) of a task's lock label; None for another label."""
    for prefix, queued in ((QUEUED_LABEL, True), (RUN_LABEL, False)):
        if label is not None and label.startswith(prefix) and len(label) > len(prefix):
            return label[len(prefix) :], queued
    return None


def _task_of(engine: Any, resource: str) -> str | None:
    """The id of the task whose lock (queued marker or run lock) holds ``resource`` on a quorum;
    None if none does, or if its holder is not a task. Read as ``Redlock.holder`` reads (values
    capped, never trusted); when too few masters answer to tell (a quorum of copies may be among
    them) it asks again, a few times, and then raises ``QuorumUnavailable`` rather than take
    "unknown" for "free" and enqueue a duplicate."""
    for attempt in range(UNKNOWN_TRIES):
        try:
            held = engine.holder(resource)
        except QuorumUnavailable:
            if attempt == UNKNOWN_TRIES - 1:
                raise
            time.sleep(engine.retry_delay)
            continue
        named = None if held is None else _task_named(held.owner.label)
        return None if named is None else named[0]
    raise AssertionError("unreachable")  # pragma: no cover (the last attempt returns or raises)


def _held_by_run_of(engine: Any, key: str, task_id: str) -> bool:
    """Whether the run lock ``key`` is free now, or held by a run of ``task_id`` itself."""
    held = engine.holder(key)
    return held is None or _task_named(held.owner.label) == (task_id, False)


def _clear_marker(engine: Any, queued: str, task_id: str) -> None:
    """Remove the queued marker of ``task_id``: compare-and-delete of the exact value that names
    it, on every master that has it; another task's marker is never touched."""
    replies = fan_out(engine.nodes, ("GET", engine.lock_key(queued)), engine.node_timeout)
    label = _label(task_id, QUEUED_LABEL)
    for value in {r for r in replies if isinstance(r, bytes)}:
        try:
            owner = parse_value(value)[1]
        except UnreadableValue:
            continue
        if label is not None and owner.label == label:
            command, script = engine.release_command((queued,), value)
            fan_out(engine.nodes, command, engine.node_timeout, script)


def _seconds_from_now(
    name: str, value: object, now: float, *, seconds: bool = True, moments: bool = True
) -> float | None:
    """Celery's ``countdown``, ``eta`` or ``expires`` option as seconds from ``now`` (negative
    when past), None when unset: a number of seconds (if ``seconds``), or a datetime or an ISO
    8601 string (if ``moments``; a naive one is UTC, as the worker reads it)."""
    if value is None or value == "":
        return None
    if seconds and isinstance(value, numbers.Real) and not isinstance(value, bool):
        if math.isfinite(value):
            return float(value)
    elif moments and isinstance(value, datetime | str):
        with contextlib.suppress(ValueError, OverflowError):
            return float(maybe_make_aware(maybe_iso8601(value)).timestamp()) - now
    kinds = [
        k
        for k, ok in (
            ("a finite number of seconds", seconds),
            ("a datetime or an ISO 8601 string", moments),
        )
        if ok
    ]
    raise ValueError(f"{name} must be {' or '.join(kinds)}, got {value!r}")


def _free_revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A task the worker discarded without calling it (revoked, or expired before it ran), or
    terminated: remove its queued marker, which would otherwise block its key for
    ``lock_queue_timeout`` and answer every ``delay()`` with a task that never runs. Runs in the
    worker's main process; compare-and-delete by the task id, as the run does (a marker of
    another task is never touched). A failure here is logged: the marker lapses by itself."""
    if not isinstance(sender, RedlockTask) or not sender.lock_unique or request is None:
        return
    from ..conf import get_redlock

    try:
        key = sender.lock_resource(request.args, request.kwargs)
        _clear_marker(get_redlock(), sender.queued_resource(key), request.id)
    except Exception:
        logger.warning(
            "task %s [%s] revoked: its queued marker could not be removed (it lapses by itself)",
            sender.name,
            getattr(request, "id", None),
            exc_info=True,
        )


task_revoked.connect(_free_revoked, weak=False, dispatch_uid="django_redlock.celery")
