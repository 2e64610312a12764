"""Tasks of Django's tasks framework that run once per key, across every worker: ``@unique_task``
(the ``tasks`` extra: the ``django-tasks`` backport on Django 5.2, ``django.tasks`` on 6.0).

::

    from django_tasks import task                    # django.tasks on Django 6.0
    from django_redlock.contrib.tasks import unique_task

    @unique_task(lock_key="report:{user_id}", lock_ttl=10)
    @task()
    def build_report(user_id: int) -> None: ...

    first = build_report.enqueue(42)
    again = build_report.enqueue(42)    # queued or running: nothing new is stored
    assert again.id == first.id

``@unique_task`` goes above ``@task`` and makes its ``Task`` a ``UniqueTask``: the same task (its
backend, queue, priority, ``using()``), whose ``enqueue`` and ``call`` take the locks. The options
are ``RedlockTask``'s (``django_redlock.contrib.celery``), checked at decoration:

- **At run time** the task runs holding the lock ``lock_key`` (formatted from its arguments),
  renewed while it runs: a worker killed with ``kill -9`` frees the key within ``lock_ttl``. When
  the key is busy (another run, or any other code): ``lock_busy = "skip"`` (the default: the task
  returns None), ``"wait"`` (up to ``lock_wait`` seconds, then skip), or ``"raise"`` (the result
  ends FAILED with ``LockContended``). The framework has no retries, so there is no ``"retry"``.
- **Unique at enqueue** (``lock_unique``, the default): ``enqueue()`` while a task with the same
  key is queued (also one whose ``run_after`` is still ahead) or running stores nothing and returns
  that task's result (``backend.get_result``), or raises ``AlreadyQueued`` with
  ``lock_raise_on_duplicate``. With a backend that cannot read results back (the immediate
  backend, which has run the task when ``enqueue`` returns), only the run lock applies.

Three names per key, because tokens never leave the process that holds them, and the backend,
not the caller, picks the result's id when it stores the task:

- ``enqueue:<key>``, a short lock held by one ``enqueue()`` at a time while it looks for a queued
  or running task and, finding none, stores one and marks it: the marker can only be taken once
  the id exists, so enqueuers take turns (waiting on the engine's queue, up to ``ENQUEUE_WAIT``).
- ``queued:<key>``, the *marker*: its label names the result id (read back verbatim, whatever its
  characters). Its TTL covers the wait until ``run_after`` plus ``lock_queue_timeout``. It is
  believed only while the result it names is READY or RUNNING: one that ended (SUCCESSFUL,
  FAILED, also without ever reaching our code) or was deleted is stale, and the next enqueue
  removes it. The worker, when it starts the task, cuts the marker's TTL to twice ``lock_ttl``
  (plus ``lock_wait`` with ``"wait"``): a worker killed before it holds the run lock frees the key
  then.
- ``<key>``, the *run* lock, taken by the worker (its label names the result id too), which then
  removes the marker by compare-and-delete of the exact value naming its result (never another's).

An enqueue reads the marker first and the run lock second: the worker takes the run lock before it
removes the marker, so a task is always seen in one or the other. The run lock held by the very
run that enqueues (a task scheduling its next run) is not a duplicate of it; the run lock held by
an earlier attempt of the same result (its worker died, and it was queued again) is waited out,
not skipped.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from datetime import datetime
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections
from django.utils import timezone

from ..engine import LockContended, LockLost, QuorumUnavailable
from ..engine.base import protocol
from ..engine.base.values import UnreadableValue, parse_value
from ..engine.locking import resources_of
from ..engine.running.drivers import fan_out
from ..engine.scripts import plain as scripts
from ..keys import bounded_resource
from . import prometheus

if TYPE_CHECKING or find_spec("django.tasks") is None:  # the backport (Django 5.2)
    from django_tasks.base import Task, TaskResult, TaskResultStatus
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_started
    from django_tasks.utils import normalize_json
else:  # Django 6.0's own
    from django.tasks.base import Task, TaskResult, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_started
    from django.utils.json import normalize_json

if TYPE_CHECKING:
    from ..engine import Lock, Redlock
    from ..engine.redlock import Holder

__all__ = ["AlreadyQueued", "UniqueTask", "unique_task"]

logger = logging.getLogger("django_redlock")

P = ParamSpec("P")
T = TypeVar("T")

BUSY_CHOICES = ("skip", "wait", "raise")
#: Seconds an ``enqueue()`` waits for its turn on ``enqueue:<key>`` before ``LockContended``.
ENQUEUE_WAIT = 10.0
#: How many times to read a key whose holder some masters' silence leaves unknown.
UNKNOWN_TRIES = 5
#: The labels of a task's locks: the result id follows, verbatim.
QUEUED = "django task queued: "
RUNNING = "django task running: "
ENQUEUING = "django task enqueue"
#: A result that may still run: a marker naming one that is neither is stale.
LIVE = (TaskResultStatus.READY, TaskResultStatus.RUNNING)


class AlreadyQueued(Exception):  # noqa: N818 (celery-once's and RedlockTask's name)
    """``enqueue()`` of a task whose key is already queued or running
    (``lock_raise_on_duplicate``); ``result_id`` is that task's result id."""

    def __init__(self, key: str, result_id: str) -> None:
        self.key = key
        self.result_id = result_id
        super().__init__(f"a task with key {key!r} is already queued or running: {result_id!r}")


#: The result the worker (or the immediate backend) is about to run in this context, from
#: ``task_started``, sent just before ``Task.call``: ``call`` gets only the arguments.
_starting: contextvars.ContextVar[TaskResult[Any] | None] = contextvars.ContextVar(
    "django_redlock_task_starting", default=None
)


#: The result whose body runs in this context: the task itself enqueueing its successor is not
#: a duplicate of itself.
_running: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "django_redlock_task_running", default=None
)


@dataclass(frozen=True, slots=True, kw_only=True)
class UniqueTask(Task[P, T], Generic[P, T]):
    """A ``Task`` whose enqueue is unique per key and whose run holds the key's lock: see the
    module docstring. Made by ``@unique_task``; ``using()`` keeps it one."""

    lock_key: str
    lock_ttl: float = 10.0
    lock_busy: str = "skip"
    lock_wait: float = 10.0
    lock_unique: bool = True
    lock_raise_on_duplicate: bool = False
    lock_queue_timeout: float = 3600.0
    _resources: Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, ...]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if not isinstance(self.lock_key, str) or not self.lock_key:
            raise ValueError(
                f"task {self.func.__qualname__}: unique_task needs lock_key (a str template over "
                f"the task's arguments, e.g. 'report:{{user_id}}'), got {self.lock_key!r}"
            )
        if self.lock_busy not in BUSY_CHOICES:
            hint = " (the tasks framework has no retries; 'wait' waits)"
            raise ValueError(
                f"lock_busy must be one of {BUSY_CHOICES}, got {self.lock_busy!r}"
                + (hint if self.lock_busy == "retry" else "")
            )
        for name in ("lock_unique", "lock_raise_on_duplicate"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        object.__setattr__(self, "lock_ttl", protocol.check_ttl(self.lock_ttl))
        wait = protocol.check_seconds("lock_wait", self.lock_wait, allow_zero=True)
        object.__setattr__(self, "lock_wait", wait)
        timeout = protocol.check_seconds(
            "lock_queue_timeout", self.lock_queue_timeout, allow_zero=False
        )
        object.__setattr__(self, "lock_queue_timeout", timeout)
        signature = inspect.signature(self.func)
        if self.takes_context:  # its first argument is the TaskContext, not the caller's
            signature = signature.replace(parameters=list(signature.parameters.values())[1:])
        resources = resources_of(self.func, (self.lock_key,), signature)
        object.__setattr__(self, "_resources", resources)
        Task.__post_init__(self)  # the backend's checks (slots: no zero-argument super())

    # --- the key ---------------------------------------------------------------------------------

    def lock_resource(self, args: Any, kwargs: Any) -> str:
        """The run lock's resource for a call with ``args`` and ``kwargs``, as the worker will
        see them: JSON-normalized, as the backend stores them (a tuple comes back a list)."""
        args, kwargs = normalize_json(list(args or ())), normalize_json(dict(kwargs or {}))
        (key,) = self._resources(tuple(args), kwargs)
        return bounded_resource(key)

    # --- enqueue ---------------------------------------------------------------------------------

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult[T]:
        backend = self.get_backend()
        if not self.lock_unique or not backend.supports_get_result:
            return backend.enqueue(self, args, kwargs)
        key = self.lock_resource(args, kwargs)  # bad arguments fail here, before any request
        if any(c.in_atomic_block for c in connections.all(initialized_only=True)):
            logger.warning(
                "task %s: enqueue of %r inside transaction.atomic(): other processes cannot read "
                "the task until the transaction commits, and take its key for free meanwhile "
                "(enqueue from transaction.on_commit)", self.module_path, key,
            )  # fmt: skip
        from ..conf import get_redlock

        engine = get_redlock()
        turn = engine.lock(
            bounded_resource(f"enqueue:{key}"),
            ttl=self.lock_ttl,
            wait=ENQUEUE_WAIT,
            label=ENQUEUING,
            auto_extend=True,
        )
        turn.acquire()
        try:
            existing = self._existing(engine, key)
            if existing is not None:
                if self.lock_raise_on_duplicate:
                    raise AlreadyQueued(key, existing.id)
                return existing
            result = backend.enqueue(self, args, kwargs)
            self._mark(engine, key, result.id)
            return result
        finally:
            try:
                turn.release()
            except LockLost:  # another enqueue may have overlapped ours: at worst, a duplicate
                logger.warning("task %s: enqueue turn on %r was lost", self.module_path, key)

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskResult[T]:
        return await sync_to_async(self.enqueue)(*args, **kwargs)

    def _existing(self, engine: Redlock, key: str) -> TaskResult[T] | None:
        """The queued or running task of ``key``: the marker's (if its result may still run; a
        stale marker is removed), else the run lock's. None if neither."""
        queued = queued_resource(key)
        marker = _holder(engine, queued)
        if marker is not None:
            result_id = _named(marker, QUEUED)
            if result_id is None:
                raise LockContended(queued, f"{queued!r} is held by {marker.owner}, not a task")
            result = self._live_result(result_id)
            if result is not None:
                return result
            _remove(engine, queued, QUEUED + result_id)  # it ended, or was deleted
        running = _holder(engine, key)
        result_id = None if running is None else _named(running, RUNNING)
        if result_id is None or result_id == _running.get():  # (a task scheduling its next run)
            return None
        return self._live_result(result_id)

    def _live_result(self, result_id: str) -> TaskResult[T] | None:
        try:
            result: TaskResult[T] = self.get_backend().get_result(result_id)
        except TaskResultDoesNotExist:
            return None
        return result if result.status in LIVE else None

    def _mark(self, engine: Redlock, key: str, result_id: str) -> None:
        """Take the marker naming ``result_id``, for as long as the task may wait to run. The
        handle is dropped at once: the worker, or the next enqueue, removes the marker."""
        label = _label(QUEUED, result_id)
        if label is None:
            logger.warning(
                "task %s: result id %r is too long to be named by a lock label; enqueue of %r "
                "is not unique", self.module_path, result_id, key
            )  # fmt: skip
            return
        ahead = 0.0
        if isinstance(self.run_after, datetime):
            ahead = max(0.0, (self.run_after - timezone.now()).total_seconds())
        ttl = min(protocol.MAX_SECONDS, ahead + self.lock_queue_timeout)
        try:
            engine.lock(queued_resource(key), ttl=ttl, label=label).acquire()
        except (LockContended, QuorumUnavailable) as error:
            # Stored already: saying it failed would make the caller enqueue it again.
            logger.warning(
                "task %s: enqueued %r but could not mark key %r as queued: %s",
                self.module_path, result_id, key, error,
            )  # fmt: skip

    # --- run -------------------------------------------------------------------------------------

    def call(self, *args: P.args, **kwargs: P.kwargs) -> T:
        result_id = self._result_id(args)
        from ..conf import get_redlock

        engine = get_redlock()
        key = self.lock_resource(args[1:] if self.takes_context else args, kwargs)
        queued = queued_resource(key)
        marker = None if result_id is None else _label(QUEUED, result_id)
        if marker is not None and self.lock_unique:
            # Until we hold the run lock, the marker is what keeps the key: a worker killed now
            # must not leave it for lock_queue_timeout. (Long enough for both tries below.)
            _shorten(engine, queued, marker, self._patience() + 2 * self.lock_ttl)
        try:
            lock = self._run_lock(engine, key, result_id)
        except LockContended:
            prometheus.job(self.module_path, "skipped")
            if marker is not None:
                _remove(engine, queued, marker)
            if self.lock_busy == "raise":
                raise
            logger.info("task %s [%s] skipped: key %r is busy", self.module_path, result_id, key)
            return None  # type: ignore[return-value]
        except QuorumUnavailable:
            prometheus.job(self.module_path, "unavailable")
            raise
        began = time.monotonic()
        outcome = "ran"
        try:
            with contextlib.ExitStack() as held:
                held.push(lock)  # acquired above: leaving releases it (LockLost if it was lost)
                if marker is not None:
                    _remove(engine, queued, marker)
                held.callback(_running.reset, _running.set(result_id))
                return Task.call(self, *args, **kwargs)
        except LockLost:
            outcome = "lost"
            raise
        finally:
            prometheus.job(self.module_path, outcome, time.monotonic() - began)

    def _patience(self) -> float:
        return self.lock_wait if self.lock_busy == "wait" else 0.0

    def _run_lock(self, engine: Redlock, key: str, result_id: str | None) -> Lock:
        """The run lock, acquired (``LockContended`` if the key stays busy). A key held by an
        earlier attempt of this very result (a worker that died, and the result queued again)
        is not a reason to skip itself: that lease lapses within lock_ttl, and is waited out."""
        label = "django task call" if result_id is None else _label(RUNNING, result_id)

        def lock(wait: float) -> Lock:
            return engine.lock(key, ttl=self.lock_ttl, wait=wait, label=label, auto_extend=True)

        try:
            return lock(self._patience()).acquire()
        except LockContended:
            held = None if result_id is None else _holder(engine, key)
            if held is None or _named(held, RUNNING) != result_id:
                raise
        return lock(self.lock_ttl).acquire()

    async def acall(self, *args: P.args, **kwargs: P.kwargs) -> T:
        return await sync_to_async(self.call)(*args, **kwargs)

    def _result_id(self, args: tuple[Any, ...]) -> str | None:
        """The id of the result being run: the context's, else the one ``task_started`` just
        announced for this task; None for a direct ``call()``."""
        if self.takes_context and args and hasattr(args[0], "task_result"):
            return str(args[0].task_result.id)
        starting = _starting.get()
        _starting.set(None)
        if starting is None or starting.task.module_path != self.module_path:
            return None
        return str(starting.id)


def unique_task(
    *,
    lock_key: str,
    lock_ttl: float = 10.0,
    lock_busy: str = "skip",
    lock_wait: float = 10.0,
    lock_unique: bool = True,
    lock_raise_on_duplicate: bool = False,
    lock_queue_timeout: float = 3600.0,
) -> Callable[[Task[P, T]], UniqueTask[P, T]]:
    """Make the ``Task`` below (``@task``) unique per ``lock_key``: see the module docstring.
    Bad options raise ``ValueError`` naming the value, at decoration."""

    def make(made: Task[P, T]) -> UniqueTask[P, T]:
        if not isinstance(made, Task):
            raise TypeError(
                f"@unique_task goes above @task (it takes the Task that @task made), got {made!r}"
            )
        if isinstance(made, UniqueTask):
            raise TypeError(f"{made.module_path} is a unique task already")
        same = {f.name: getattr(made, f.name) for f in fields(made) if f.init}
        return UniqueTask(
            **same,
            lock_key=lock_key,
            lock_ttl=lock_ttl,
            lock_busy=lock_busy,
            lock_wait=lock_wait,
            lock_unique=lock_unique,
            lock_raise_on_duplicate=lock_raise_on_duplicate,
            lock_queue_timeout=lock_queue_timeout,
        )

    return make


def queued_resource(key: str) -> str:
    return bounded_resource(f"queued:{key}")


def _remember_starting(sender: Any, task_result: TaskResult[Any], **kwargs: Any) -> None:
    if isinstance(task_result.task, UniqueTask):
        _starting.set(task_result)


task_started.connect(_remember_starting, weak=False, dispatch_uid="django_redlock.unique_task")


def _label(prefix: str, result_id: str) -> str | None:
    """The label naming ``result_id``; None if it would be longer than a label may be."""
    label = prefix + result_id
    return label if len(label) <= protocol.MAX_LABEL_LENGTH else None


def _named(held: Holder, prefix: str) -> str | None:
    """The result id a holder's label names after ``prefix`` (verbatim: spaces and all); None if
    the holder is not a task's."""
    label = held.owner.label or ""
    return label[len(prefix) :] if label.startswith(prefix) and len(label) > len(prefix) else None


def _holder(engine: Redlock, resource: str) -> Holder | None:
    """Who holds ``resource`` on a quorum. When too few masters answer to tell, asks again a few
    times, then raises ``QuorumUnavailable`` rather than take "unknown" for "free" (and store a
    duplicate)."""
    for attempt in range(UNKNOWN_TRIES):
        try:
            return engine.holder(resource)
        except QuorumUnavailable:
            if attempt == UNKNOWN_TRIES - 1:
                raise
            time.sleep(engine.retry_delay)
    raise AssertionError("unreachable")  # pragma: no cover (the last attempt returns or raises)


def _values_labelled(engine: Redlock, resource: str, label: str) -> set[bytes]:
    """The values of ``resource`` on the masters whose label is exactly ``label``."""
    replies = fan_out(engine.nodes, ("GET", engine.lock_key(resource)), engine.node_timeout)
    found = set()
    for value in {r for r in replies if isinstance(r, bytes)}:
        with contextlib.suppress(UnreadableValue):
            if parse_value(value)[1].label == label:
                found.add(value)
    return found


def _remove(engine: Redlock, resource: str, label: str) -> None:
    """Compare-and-delete of the values labelled ``label``, on every master that has one: a
    marker naming another result is never touched."""
    for value in _values_labelled(engine, resource, label):
        command, script = engine.release_command((resource,), value)
        fan_out(engine.nodes, command, engine.node_timeout, script)


def _shorten(engine: Redlock, resource: str, label: str, seconds: float) -> None:
    """Compare-and-expire: the values labelled ``label`` now lapse ``seconds`` from now."""
    millis = str(max(1, round(seconds * 1000)))
    for value in _values_labelled(engine, resource, label):
        command = scripts.EXTEND.evalsha((engine.lock_key(resource),), (value, millis))
        fan_out(engine.nodes, command, engine.node_timeout, scripts.EXTEND)
