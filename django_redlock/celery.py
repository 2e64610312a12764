"""Celery tasks that run once per key, across every worker: ``RedlockTask`` (the ``celery`` extra).

::

    @app.task(base=RedlockTask, lock_key="report:{user_id}", lock_ttl=10)
    def build_report(user_id: int) -> None: ...

- **At run time** the task runs holding the lock ``lock_key`` (formatted from its arguments),
  renewed while it runs (``lock_ttl`` is the lease: a worker killed with ``kill -9`` frees the key
  within it). When the key is busy (held by another run, or by any other code): ``lock_busy =
  "skip"`` (the default: the task returns None), ``"retry"`` (``self.retry`` after
  ``lock_retry_countdown`` seconds, as Celery's own retries count), or ``"wait"`` (up to
  ``lock_wait`` seconds, then skip).
- **Unique at enqueue** (``lock_unique = True``, the default): ``delay()`` / ``apply_async()``
  while a task with the same key is queued or running publishes nothing and returns that task's
  ``AsyncResult`` (the same id for every caller), or raises ``AlreadyQueued`` with
  ``lock_raise_on_duplicate = True``.

Two leases per task, because tokens never leave the process that holds them, and the enqueuer and
the worker are different processes: a *queued* marker ``queued:<key>`` taken at enqueue (its label
names the task id, so a duplicate can return it; it lapses after ``lock_queue_timeout`` if the
broker loses the message), and the *run* lock ``<key>``, taken by the worker, which then removes
the marker by compare-and-delete of the exact value naming its task id (never by force). Only the
run lock is held while the task works, under a short renewed lease: a crashed worker blocks the
key for ``lock_ttl``, not for an hour.

Options are checked when Celery builds the task class (at decoration when the app is finalized,
as in a worker; else when the app finalizes, before any task is sent): a ``lock_key`` naming an
argument the task does not have raises ``ValueError`` then.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import time
from typing import Any, ClassVar

from celery import Task
from celery.result import AsyncResult
from kombu.utils.uuid import uuid

from . import metrics
from .engine import LockContended, LockLost, QuorumUnavailable, protocol
from .engine.drivers import fan_out
from .engine.locking import resources_of
from .engine.values import UnreadableValue, parse_value
from .keys import bounded_resource
from .locks import DjangoLock, layer

__all__ = ["AlreadyQueued", "RedlockTask"]

logger = logging.getLogger("django_redlock")

BUSY_CHOICES = ("skip", "retry", "wait")
#: How many times to read a key whose holder some masters' silence leaves unknown.
UNKNOWN_TRIES = 5
#: How the locks of a task name it (their label, shown by the admin and ``redlock_status``).
_LABEL = re.compile(r"celery task (?P<id>[^ ]+)(?P<queued> queued)?")


class AlreadyQueued(Exception):  # noqa: N818 (celery-once's name, for those who know it)
    """``delay()`` of a task whose key is already queued or running (``lock_raise_on_duplicate``);
    ``task_id`` is that task's id."""

    def __init__(self, key: str, task_id: str) -> None:
        self.key = key
        self.task_id = task_id
        super().__init__(f"a task with key {key!r} is already queued or running: {task_id}")


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
        from .conf import get_redlock

        engine = get_redlock()
        key = self.lock_resource(args, kwargs)
        queued = self.queued_resource(key)
        task_id = task_id or uuid()
        if options.get("retries"):
            # Celery's own retry of a task that ran (same id): it must be sent, whatever holds
            # the key; it is queued again under a fresh marker.
            _clear_marker(engine, queued, task_id)
            self._mark_queued(engine, queued, task_id)
            return super().apply_async(args, kwargs, task_id=task_id, **options)
        # The running task first, then the queued one: a caller that took the marker just as a
        # task started holds it for a moment only (it finds that task running, and lets go), so
        # its id must never be the answer while a task runs.
        for _ in range(5):  # a holder gone between our attempt and our look: try again
            running = _task_of(engine, key)
            if running is not None:
                return self._duplicate(key, running)
            if not self._mark_queued(engine, queued, task_id):
                existing = _task_of(engine, key) or _task_of(engine, queued)
                if existing is not None:
                    return self._duplicate(key, existing)
                continue
            running = _task_of(engine, key)  # started between our look and our marker
            if running is not None:
                _clear_marker(engine, queued, task_id)
                return self._duplicate(key, running)
            try:
                return super().apply_async(args, kwargs, task_id=task_id, **options)
            except BaseException:
                _clear_marker(engine, queued, task_id)
                raise
        raise LockContended(key, f"task key {key!r} is busy, and its holder is not a task")

    def _mark_queued(self, engine: Any, queued: str, task_id: str) -> bool:
        """Take the queued marker for ``task_id``; False if another one holds it. The handle
        is dropped at once: the marker outlives this process's interest in it, and lapses
        after ``lock_queue_timeout`` unless the worker removes it first."""
        marker = engine.lock(queued, ttl=self.lock_queue_timeout, label=_label(task_id, True))
        try:
            marker.acquire()
        except LockContended:
            return False
        return True

    def _duplicate(self, key: str, task_id: str) -> AsyncResult:
        if self.lock_raise_on_duplicate:
            raise AlreadyQueued(key, task_id)
        return self.AsyncResult(task_id)

    # --- run -------------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .conf import get_redlock

        engine = get_redlock()
        key = self.lock_resource(args, kwargs)
        task_id = self.request.id or self.name
        # The Django layer's handle (unguarded, as the task always ran): called inside a
        # transaction, its run lock waits for that transaction's end (``transactions.py``).
        lock = DjangoLock(
            engine,
            key,
            ttl=self.lock_ttl,
            wait=self.lock_wait if self.lock_busy == "wait" else 0.0,
            label=_label(task_id, False),
            auto_extend=True,
        )
        lock._layer = layer(False, None, self.lock_release_before_commit)
        try:
            lock.acquire()
        except LockContended:
            metrics.job(self.name, "skipped")
            if self.lock_busy == "retry":
                raise self.retry(countdown=self.lock_retry_countdown) from None
            _clear_marker(engine, self.queued_resource(key), task_id)
            logger.info("task %s [%s] skipped: key %r is busy", self.name, task_id, key)
            return None
        except QuorumUnavailable:
            metrics.job(self.name, "unavailable")
            raise
        began = time.monotonic()
        outcome = "ran"
        try:
            with contextlib.ExitStack() as held:
                held.push(lock)  # acquired above: leaving releases it (LockLost if it was lost)
                _clear_marker(engine, self.queued_resource(key), task_id)
                return super().__call__(*args, **kwargs)
        except LockLost:
            outcome = "lost"
            raise
        finally:
            metrics.job(self.name, outcome, time.monotonic() - began)


def _label(task_id: str, queued: bool) -> str:
    return f"celery task {task_id}" + (" queued" if queued else "")


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
        match = None if held is None else _LABEL.fullmatch(held.owner.label or "")
        return match["id"] if match else None
    raise AssertionError("unreachable")  # pragma: no cover (the last attempt returns or raises)


def _clear_marker(engine: Any, queued: str, task_id: str) -> None:
    """Remove the queued marker of ``task_id``: compare-and-delete of the exact value that names
    it, on every master that has it; another task's marker is never touched."""
    replies = fan_out(engine.nodes, ("GET", engine.lock_key(queued)), engine.node_timeout)
    label = _label(task_id, True)
    for value in {r for r in replies if isinstance(r, bytes)}:
        try:
            owner = parse_value(value)[1]
        except UnreadableValue:
            continue
        if owner.label == label:
            command, script = engine.release_command((queued,), value)
            fan_out(engine.nodes, command, engine.node_timeout, script)
