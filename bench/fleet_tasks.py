"""The Celery app of ``bench.fleet``: the same task under ``RedlockTask`` and under celery-once's
``QueueOnce``, on one Redis broker (``REDLOCK_BENCH_BROKER``); the lock masters come from
``REDLOCK_TEST_NODES`` (``tests.settings_subprocess``).

Each run appends "<task id> <pid> <start> <end>" to ``runs:<kind>:<n>`` in the broker's Redis
and its pid to ``started:<kind>:<n>`` (for ``kill -9``). ``ours_late``: the same, redelivered
when its worker dies."""

from __future__ import annotations

import os
import time

import django
import redis
from celery import Celery
from celery_once import QueueOnce

from django_redlock.contrib.celery import RedlockTask

django.setup()

BROKER = os.environ.get("REDLOCK_BENCH_BROKER", "memory://")
app = Celery("redlock_bench")
app.conf.update(
    broker_url=BROKER,
    result_backend=BROKER,
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    ONCE={"backend": "celery_once.backends.Redis", "settings": {"url": BROKER}},
)


def _work(kind: str, n: int, seconds: float, task_id: str | None) -> None:
    client = redis.Redis.from_url(BROKER)
    try:
        began = time.time()
        client.rpush(f"started:{kind}:{n}", os.getpid())
        time.sleep(seconds)
        client.rpush(f"runs:{kind}:{n}", f"{task_id} {os.getpid()} {began} {time.time()}")
    finally:
        client.close()


@app.task(bind=True, base=RedlockTask, lock_key="bench:{n}", lock_ttl=1.0)
def ours(self, n: int, seconds: float) -> None:
    _work("ours", n, seconds, self.request.id)


@app.task(bind=True, base=RedlockTask, lock_key="bench:{n}", lock_ttl=1.0, lock_queue_timeout=1.0)
def ours_brief_queue(self, n: int, seconds: float) -> None:
    """``ours`` with a 1 s queue timeout: a countdown longer than it (the "mixed" enqueues)."""
    _work("ours", n, seconds, self.request.id)


@app.task(bind=True, base=QueueOnce, once={"graceful": False})
def once(self, n: int, seconds: float) -> None:
    _work("once", n, seconds, self.request.id)


@app.task(
    bind=True,
    base=RedlockTask,
    lock_key="late:{n}",
    lock_ttl=1.0,
    acks_late=True,
    reject_on_worker_lost=True,
)
def ours_late(self, n: int, seconds: float) -> str:
    """Given back to the broker when its worker dies (acks_late, reject_on_worker_lost): its
    first start takes ``seconds`` (``kill -9`` comes meanwhile), a later one 0.2 s; each start
    is counted in ``starts:late:<n>``, each completed body appended to ``runs:late:<n>``."""
    client = redis.Redis.from_url(BROKER)
    try:
        first = client.incr(f"starts:late:{n}") == 1
        began = time.time()
        client.rpush(f"started:late:{n}", os.getpid())
        time.sleep(seconds if first else 0.2)
        client.rpush(f"runs:late:{n}", f"{self.request.id} {os.getpid()} {began} {time.time()}")
    finally:
        client.close()
    return "done"
