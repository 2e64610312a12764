"""The Celery app and tasks of the Celery tests (``tests/test_celery.py``): a real ``celery worker``
runs this module, with the broker (a redis-server of the test's own) in ``REDLOCK_TEST_BROKER``
and the lock masters in ``REDLOCK_TEST_NODES`` (``tests.settings_subprocess``).

Each run records itself in the broker's Redis (list ``runs:<key>``: "<task id> <pid> <start>
<end>", wall clock), so the test can count executions and see overlaps, and publishes the pid
that runs it (``started:<key>``) so that the test can kill it, and counts its starts
(``starts:<key>``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import django
import redis
from celery import Celery

from django_redlock.contrib.celery import RedlockTask

django.setup()

app = Celery("redlock_tests")
app.conf.update(
    broker_url=os.environ.get("REDLOCK_TEST_BROKER", "memory://"),
    result_backend=os.environ.get("REDLOCK_TEST_BROKER", "cache+memory://"),
    task_acks_late=False,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


def _record(key: str, task_id: str | None, began: float) -> None:
    client = redis.Redis.from_url(app.conf.broker_url)
    try:
        client.rpush(f"runs:{key}", f"{task_id} {os.getpid()} {began} {time.time()}")
    finally:
        client.close()


def _started(key: str) -> int:
    """Publish this process's pid; how many runs of ``key`` started, this one included (counted
    in ``starts:<key>``: the test pops ``started:<key>``)."""
    client = redis.Redis.from_url(app.conf.broker_url)
    try:
        starts = int(client.incr(f"starts:{key}"))  # first: the test may kill us once it sees
        client.rpush(f"started:{key}", os.getpid())
        return starts
    finally:
        client.close()


@app.task(bind=True, base=RedlockTask, lock_key="report:{user_id}", lock_ttl=1.0)
def report(self, user_id: int, seconds: float = 0.5) -> str:
    began = time.time()
    _started(f"report:{user_id}")
    time.sleep(seconds)
    _record(f"report:{user_id}", self.request.id, began)
    return f"report {user_id} by {os.getpid()}"


@app.task(base=RedlockTask, lock_key="fail:{n}", lock_ttl=1.0)
def failing(n: int) -> None:
    raise RuntimeError(f"task {n} fails")


@app.task(base=RedlockTask, lock_key="busy:{n}", lock_unique=False, lock_busy="skip")
def busy_skip(n: int) -> str:
    _record(f"busy:{n}", None, time.time())
    return "ran"


@app.task(
    base=RedlockTask,
    lock_key="busy:{n}",
    lock_unique=False,
    lock_busy="retry",
    lock_retry_countdown=0.3,
    max_retries=20,
)
def busy_retry(n: int) -> str:
    _record(f"busy:{n}", None, time.time())
    return "ran"


@app.task(
    base=RedlockTask, lock_key="busy:{n}", lock_unique=False, lock_busy="wait", lock_wait=10.0
)
def busy_wait(n: int) -> str:
    _record(f"busy:{n}", None, time.time())
    return "ran"


@app.task(base=RedlockTask, lock_key="busy:{n}", lock_unique=False, lock_busy="wait", lock_wait=0.5)
def busy_wait_briefly(n: int) -> str:
    _record(f"busy:{n}", None, time.time())
    return "ran"


@app.task(base=RedlockTask, lock_key="lost:{n}", lock_queue_timeout=1.0)
def never_consumed(n: int) -> None:
    """Sent to a queue no worker reads: a message the broker lost, as far as the key can tell."""


@app.task(base=RedlockTask, lock_key="strict:{n}", lock_raise_on_duplicate=True)
def strict(n: int, seconds: float = 1.0) -> None:
    time.sleep(seconds)


@app.task(
    bind=True,
    base=RedlockTask,
    lock_key="later:{n}",
    lock_ttl=1.0,
    lock_queue_timeout=1.0,
    max_retries=1,
)
def later(self, n: int, retry_in: float = 0.0) -> str:
    """Sent with a countdown or eta longer than its queue timeout; with ``retry_in``, its first
    run retries itself once with that countdown."""
    began = time.time()
    if retry_in and not self.request.retries:
        raise self.retry(countdown=retry_in)
    _record(f"later:{n}", self.request.id, began)
    return "ran"


@app.task(
    bind=True,
    base=RedlockTask,
    lock_key="redelivered:{n}",
    lock_ttl=1.0,
    acks_late=True,
    reject_on_worker_lost=True,
)
def redelivered(self, n: int, seconds: float) -> str:
    """Celery's way to run again a task whose worker died: the message is acknowledged only
    when the task ends, and given back to the broker when its process is lost. The first run
    of a key takes ``seconds``, or until the test sets ``go:redelivered:<n>`` (to be killed or
    doubled meanwhile); a later one a moment."""
    return _redelivered_body(self, n, seconds)


@app.task(
    bind=True,
    base=RedlockTask,
    lock_key="redelivered:{n}",
    lock_ttl=1.0,
    lock_busy="wait",
    acks_late=True,
    reject_on_worker_lost=True,
)
def redelivered_waiting(self, n: int, seconds: float) -> str:
    """``redelivered`` with lock_busy="wait"."""
    return _redelivered_body(self, n, seconds)


def _redelivered_body(self: Any, n: int, seconds: float) -> str:
    began = time.time()
    first = _started(f"redelivered:{n}") == 1
    client = redis.Redis.from_url(app.conf.broker_url)
    try:
        client.blpop([f"go:redelivered:{n}"], timeout=seconds if first else 0.1)
    finally:
        client.close()
    _record(f"redelivered:{n}", self.request.id, began)
    return "done"


@app.task
def total(results: list[object]) -> int:
    """A chord's body: how many of its header's results it got."""
    return len(results)
