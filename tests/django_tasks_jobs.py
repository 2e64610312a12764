"""The tasks of ``tests/test_django_tasks.py`` (django-tasks' ``@task`` under ``@unique_task``): its
``db_worker`` processes import them from here, by the path the database backend stores.

Each run records itself in the recorder Redis (``REDLOCK_TEST_RECORDER``: list ``runs:<key>``,
"<pid> <start> <end>", wall clock) so that the test can count executions and see overlaps, and
publishes the pid that runs it first (``started:<key>``) so that the test can kill it.
"""

from __future__ import annotations

import os
import time

import redis
from django_tasks import task

from django_redlock.contrib.tasks import unique_task


def _recorder() -> redis.Redis:
    return redis.Redis.from_url(os.environ["REDLOCK_TEST_RECORDER"])


def _started(key: str) -> float:
    client = _recorder()
    try:
        client.rpush(f"started:{key}", os.getpid())
    finally:
        client.close()
    return time.time()


def _record(key: str, began: float) -> None:
    client = _recorder()
    try:
        client.rpush(f"runs:{key}", f"{os.getpid()} {began} {time.time()}")
    finally:
        client.close()


@unique_task(lock_key="report:{user_id}", lock_ttl=1.0)
@task()
def report(user_id: int, seconds: float = 0.5) -> str:
    began = _started(f"report:{user_id}")
    time.sleep(seconds)
    _record(f"report:{user_id}", began)
    return f"report {user_id} by {os.getpid()}"


@unique_task(lock_key="fail:{n}", lock_ttl=1.0)
@task()
def failing(n: int) -> None:
    raise RuntimeError(f"task {n} fails")


@unique_task(lock_key="later:{n}", lock_ttl=1.0, lock_queue_timeout=1.0)
@task()
def later(n: int) -> None:
    """Enqueued with run_after: a marker that lived only lock_queue_timeout would lapse first."""
    _record(f"later:{n}", _started(f"later:{n}"))


@unique_task(lock_key="busy:{n}", lock_unique=False, lock_busy="skip")
@task()
def busy_skip(n: int) -> str:
    _record(f"busy:{n}", time.time())
    return "ran"


@unique_task(lock_key="busy:{n}", lock_unique=False, lock_busy="raise")
@task()
def busy_raise(n: int) -> str:
    _record(f"busy:{n}", time.time())
    return "ran"


@unique_task(lock_key="busy:{n}", lock_busy="wait", lock_wait=20.0, lock_ttl=1.0)
@task()
def busy_wait(n: int) -> str:
    _record(f"busy:{n}", time.time())
    return "ran"


@unique_task(lock_key="busy:{n}", lock_busy="wait", lock_wait=2.0, lock_ttl=1.0)
@task()
def busy_wait_briefly(n: int) -> str:
    _record(f"busy:{n}", time.time())
    return "ran"


@unique_task(lock_key="strict:{n}", lock_raise_on_duplicate=True)
@task(queue_name="nowhere")
def strict(n: int) -> None:
    """Never run (no worker reads its queue)."""


@unique_task(lock_key="context:{n}", lock_ttl=1.0)
@task(takes_context=True)
def with_context(context: object, n: int, seconds: float = 0.0) -> str:
    began = _started(f"context:{n}")
    time.sleep(seconds)
    _record(f"context:{n}", began)
    return str(context.task_result.id)  # type: ignore[attr-defined]


@unique_task(lock_key="chain:{n}", lock_ttl=1.0, lock_busy="wait", lock_wait=10.0)
@task()
def chain(n: int, left: int) -> str:
    """Enqueues its own next run (same key) while it runs, ``left`` times. The next run may be
    claimed before this one ends: it waits for the key rather than skip."""
    _record(f"chain:{n}", time.time())
    return "last" if left == 0 else chain.enqueue(n, left - 1).id


@unique_task(lock_key="async:{n}", lock_ttl=1.0)
@task()
async def async_report(n: int, seconds: float = 0.0) -> str:
    """A coroutine task: the worker runs it with async_to_sync, inside the same run lock."""
    import asyncio

    _started(f"async:{n}")
    await asyncio.sleep(seconds)
    _record(f"async:{n}", time.time())
    return "async ran"
