"""The Celery app of ``bench.fleet``: the same task under ``RedlockTask`` and under celery-once's
``QueueOnce``, on one Redis broker (``REDLOCK_BENCH_BROKER``); the lock masters come from
``REDLOCK_TEST_NODES`` (``tests.settings_subprocess``).

Each run appends "<task id> <pid> <start> <end>" to ``runs:<kind>:<n>`` in the broker's Redis
and its pid to ``started:<kind>:<n>`` (for ``kill -9``)."""

from __future__ import annotations

import os
import time

import django
import redis
from celery import Celery
from celery_once import QueueOnce

from django_redlock.celery import RedlockTask

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


@app.task(bind=True, base=QueueOnce, once={"graceful": False})
def once(self, n: int, seconds: float) -> None:
    _work("once", n, seconds, self.request.id)
