"""``RedlockTask`` with a real ``celery worker`` (prefork, 2 processes) on a Redis broker of the
test's own, and the five lock masters: no eager mode, which would prove nothing about two
processes. Tasks: ``tests/celery_tasks.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from django_redlock import is_locked, redlock
from django_redlock.engine import QuorumUnavailable
from django_redlock.testing.masters import LocalMaster, local_masters
from tests.conftest import ROOT, wait_until

WORKER_READY_TIMEOUT = 60
#: The module's worker's log (stdout and stderr), once it started.
WORKER_LOG: list[Path] = []


@pytest.fixture(scope="module")
def worker(
    tmp_path_factory: pytest.TempPathFactory,
    _shared_masters: dict[int, list[LocalMaster]],
) -> Iterator[Any]:
    """A broker and one ``celery worker`` for the module; yields ``tests.celery_tasks``."""
    base = tmp_path_factory.mktemp("celery")
    with local_masters(1, base / "broker") as (broker,):
        url = broker.url
        os.environ["REDLOCK_TEST_BROKER"] = url
        from tests import celery_tasks

        celery_tasks.app.conf.update(broker_url=url, result_backend=url)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings_subprocess",
            "REDLOCK_TEST_NODES": ",".join(m.url for m in _shared_masters[5]),
            "REDLOCK_TEST_DB": str(base / "db.sqlite3"),
            "REDLOCK_TEST_BROKER": url,
            "PYTHONPATH": str(ROOT),
        }
        log = (base / "worker.log").open("w+")
        proc = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "celery", "-A", "tests.celery_tasks", "worker",
             "--pool=prefork", "--concurrency=2", "--without-gossip", "--without-mingle",
             "--without-heartbeat", "--loglevel=INFO"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + WORKER_READY_TIMEOUT
            while "ready." not in Path(log.name).read_text():
                assert proc.poll() is None, Path(log.name).read_text()
                assert time.monotonic() < deadline, Path(log.name).read_text()
                time.sleep(0.1)
            WORKER_LOG.append(Path(log.name))
            yield celery_tasks
        finally:
            WORKER_LOG.clear()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            os.environ.pop("REDLOCK_TEST_BROKER", None)


@pytest.fixture
def tasks(worker: Any, redlock_settings: list[LocalMaster]) -> Any:
    client = _broker(worker)
    for key in client.scan_iter("runs:*"):
        client.delete(key)
    for pattern in ("started:*", "starts:*", "go:*"):
        for key in client.scan_iter(pattern):
            client.delete(key)
    client.close()
    return worker


def _broker(tasks: Any) -> redis.Redis:
    return redis.Redis.from_url(tasks.app.conf.broker_url)


def runs(tasks: Any, key: str) -> list[list[str]]:
    client = _broker(tasks)
    try:
        return [r.decode().split() for r in client.lrange(f"runs:{key}", 0, -1)]
    finally:
        client.close()


def started_pid(tasks: Any, key: str, timeout: float = 20) -> int:
    # (redis-py's default socket timeout, 5 s, would end the wait sooner: the pool can take
    # that long to see a process killed, and to give its task to another)
    client = redis.Redis.from_url(tasks.app.conf.broker_url, socket_timeout=timeout + 5)
    try:
        reply = client.blpop([f"started:{key}"], timeout=timeout)
    finally:
        client.close()
    assert reply is not None, f"{key} never started"
    return int(reply[1])


def locked(resource: str) -> bool | None:
    """``is_locked``, polled by ``wait_until``: None (not yet known) when too few masters answer
    to tell, as they may on a loaded machine."""
    try:
        return is_locked(resource)
    except QuorumUnavailable:
        return None


def test_duplicate_enqueues_return_the_queued_or_running_task(tasks: Any) -> None:
    first = tasks.report.delay(1, 1.0)
    queued = tasks.report.delay(1, 1.0)  # most likely still queued
    started_pid(tasks, "report:1")
    running = [tasks.report.delay(1, 1.0) for _ in range(10)]  # running now
    assert {r.id for r in [queued, *running]} == {first.id}
    assert first.get(timeout=20).startswith("report 1 by")
    assert [run[0] for run in runs(tasks, "report:1")] == [first.id]  # one execution
    # Finished: the key is free, and the next delay() is a new task.
    assert not is_locked("report:1")
    assert not is_locked("queued:report:1")
    again = tasks.report.delay(1, 0.0)
    assert again.id != first.id
    again.get(timeout=20)
    assert len(runs(tasks, "report:1")) == 2


def test_other_keys_run_side_by_side(tasks: Any) -> None:
    a, b = tasks.report.delay(10, 0.5), tasks.report.delay(11, 0.5)
    assert a.id != b.id
    a.get(timeout=20)
    b.get(timeout=20)


def test_a_failed_task_frees_its_key(tasks: Any) -> None:
    first = tasks.failing.delay(1)
    with pytest.raises(RuntimeError, match="task 1 fails"):
        first.get(timeout=20)
    assert not is_locked("fail:1")
    assert not is_locked("queued:fail:1")
    assert tasks.failing.delay(1).id != first.id


def test_a_worker_killed_mid_task_frees_the_key_within_its_ttl(tasks: Any) -> None:
    """kill -9 of the process running the task: the run lock (lock_ttl = 1 s, renewed while
    the task ran) lapses within its TTL, not after an hour as celery-once's lock does."""
    tasks.report.delay(2, 30.0)
    pid = started_pid(tasks, "report:2")
    assert is_locked("report:2")
    os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    while is_locked("report:2"):
        assert time.monotonic() - killed < 1.0 + 0.5, "the key outlived the task's lease"
        time.sleep(0.02)
    fresh = tasks.report.delay(2, 0.0)
    fresh.get(timeout=20)


def test_a_busy_key_is_skipped(tasks: Any) -> None:
    with redlock("busy:1", ttl=10):
        assert tasks.busy_skip.delay(1).get(timeout=20) is None
    assert runs(tasks, "busy:1") == []


def test_a_busy_key_is_retried(tasks: Any) -> None:
    holder = redlock("busy:2", ttl=10)
    holder.acquire()
    result = tasks.busy_retry.delay(2)
    time.sleep(1.0)  # retried every 0.3 s meanwhile, never run
    assert runs(tasks, "busy:2") == []
    holder.release()
    assert result.get(timeout=20) == "ran"
    assert len(runs(tasks, "busy:2")) == 1


def test_a_busy_key_is_waited_for_and_the_task_runs_after_the_release(tasks: Any) -> None:
    holder = redlock("busy:3", ttl=10)
    holder.acquire()
    result = tasks.busy_wait.delay(3)
    time.sleep(1.0)  # the task waits in its worker (lock_wait=10 s), it does not run
    assert runs(tasks, "busy:3") == []
    released = time.time()
    holder.release()
    assert result.get(timeout=20) == "ran"
    ((_, _, began, _),) = runs(tasks, "busy:3")
    assert float(began) >= released - 0.05  # (wall clocks of one machine: a small allowance)


def test_a_busy_key_held_past_the_wait_is_skipped(tasks: Any) -> None:
    with redlock("busy:4", ttl=10):
        started = time.monotonic()
        assert tasks.busy_wait_briefly.delay(4).get(timeout=20) is None
        assert time.monotonic() - started >= 0.5  # it waited its lock_wait first
    assert runs(tasks, "busy:4") == []


def test_a_task_the_broker_lost_frees_its_key_after_the_queue_timeout(tasks: Any) -> None:
    lost = tasks.never_consumed.apply_async((1,), queue="nowhere")
    assert tasks.never_consumed.apply_async((1,), queue="nowhere").id == lost.id
    time.sleep(1.0 + 0.2)  # lock_queue_timeout = 1 s
    assert tasks.never_consumed.apply_async((1,), queue="nowhere").id != lost.id


def test_a_duplicate_can_raise(tasks: Any) -> None:
    from django_redlock.contrib.celery import AlreadyQueued

    first = tasks.strict.delay(1, 0.5)
    with pytest.raises(AlreadyQueued, match=first.id) as raised:
        tasks.strict.delay(1)
    assert raised.value.task_id == first.id
    first.get(timeout=20)


def test_concurrent_enqueues_from_threads_get_one_task(tasks: Any) -> None:
    ids: list[str] = []

    def enqueue() -> None:
        ids.append(tasks.report.delay(3, 0.5).id)

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(ids)) == 1
    tasks.report.AsyncResult(ids[0]).get(timeout=20)
    assert len(runs(tasks, "report:3")) == 1


def test_a_storm_of_enqueues_while_it_runs_gets_the_running_tasks_id(tasks: Any) -> None:
    """Callers that take the (free) queued marker while the task runs hold it a moment only:
    a caller that reads the marker then must not answer with that caller's unsent task id."""
    first = tasks.report.delay(4, 2.0)
    started_pid(tasks, "report:4")
    ids: list[str] = []

    def enqueue() -> None:
        ids.extend(tasks.report.delay(4, 2.0).id for _ in range(15))

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(ids) == {first.id}
    first.get(timeout=20)


# --- a task sent for later, a task id of any shape -----------------------------------------------


def test_a_task_sent_for_later_stays_unique_until_it_runs(tasks: Any) -> None:
    """``later`` has lock_queue_timeout = 1 s, and each is sent to start 4 s ahead (a countdown,
    an eta, a retry's countdown): its marker lives until then plus the queue timeout, so a
    ``delay()`` past the queue timeout still returns it, and each key runs once."""
    counted = tasks.later.apply_async((1,), countdown=4.0)
    dated = tasks.later.apply_async((2,), eta=datetime.now(UTC) + timedelta(seconds=4.0))
    time.sleep(1.0 + 0.3)  # past the queue timeout (1 s), long before they start (4 s)
    assert tasks.later.delay(1).id == counted.id
    assert tasks.later.delay(2).id == dated.id
    retried = tasks.later.delay(3, 4.0)  # its first run retries itself 4 s ahead
    assert wait_until(lambda: retried.state == "RETRY", 20)
    time.sleep(1.0 + 0.3)
    assert tasks.later.delay(3).id == retried.id
    for n, first in ((1, counted), (2, dated), (3, retried)):
        assert first.get(timeout=20) == "ran"
        assert [run[0] for run in runs(tasks, f"later:{n}")] == [first.id]


def test_the_queued_marker_lives_until_the_task_may_start(tasks: Any) -> None:
    """``marker_ttl``: no network; lock_queue_timeout is 1 s for ``later``."""
    ttl = tasks.later.marker_ttl
    now = datetime.now(UTC)
    assert ttl({}) == 1.0
    assert 100.5 < ttl({"countdown": 100}) <= 101.0
    assert 10.5 < ttl({"countdown": 100, "expires": 10}) <= 11.0  # discarded when it expires
    assert 10.5 < ttl({"countdown": 100, "expires": now + timedelta(seconds=10)}) <= 11.0
    assert ttl({"eta": now - timedelta(hours=1)}) == 1.0  # late already: the queue timeout
    assert 60.5 < ttl({"eta": (now + timedelta(seconds=60)).isoformat()}) <= 61.0
    naive = (now + timedelta(seconds=60)).replace(tzinfo=None)  # UTC, as the worker reads it
    assert 60.5 < ttl({"eta": naive}) <= 61.0
    assert ttl({"countdown": 0, "eta": now + timedelta(seconds=60)}) > 60.5  # Celery's reading


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"task_id": "r" * 181}, "task_id is 181 characters long, more than the 180"),
        ({"task_id": "bad \ud800 id"}, "task_id has a lone surrogate at position 4"),
        ({"task_id": 42}, "task_id must be a str, got int 42"),
        ({"countdown": float("nan")}, "countdown must be a finite number of seconds, got nan"),
        ({"countdown": "soon"}, "countdown must be a finite number of seconds, got 'soon'"),
        ({"eta": "tomorrow"}, "eta must be a datetime or an ISO 8601 string, got 'tomorrow'"),
        ({"eta": 5}, "eta must be a datetime or an ISO 8601 string, got 5"),
        ({"expires": [1]}, r"expires must be a finite number of seconds or a datetime"),
        ({"countdown": 2 * 365 * 86400}, "its queued marker cannot live that long"),
    ],
)
def test_enqueue_options_a_marker_cannot_hold_fail_before_anything_is_sent(
    tasks: Any, options: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        tasks.report.apply_async((70, 0.0), **options)
    assert not is_locked("queued:report:70")


def test_a_task_id_with_spaces_reads_back(tasks: Any) -> None:
    """Any id Celery accepts reads back from the labels: a duplicate, queued or running, gets it."""
    first = tasks.report.apply_async((42, 1.0), task_id="report 42")
    assert tasks.report.delay(42, 1.0).id == "report 42"  # most likely still queued
    started_pid(tasks, "report:42")
    assert tasks.report.delay(42, 1.0).id == "report 42"  # running
    assert tasks.report.apply_async((42,), task_id="report 42").id == "report 42"  # itself
    assert first.get(timeout=20).startswith("report 42 by")
    assert len(runs(tasks, "report:42")) == 1


# --- revoked and expired tasks --------------------------------------------------------------------


def test_a_revoked_task_frees_its_key(tasks: Any) -> None:
    """The worker discards a revoked task without calling it: its marker goes then (Celery's
    task_revoked signal), not after lock_queue_timeout (an hour for ``report``). A revoke that
    reached the worker before the message, and one that came while it waited for its eta."""
    early = tasks.report.AsyncResult(f"revoked-early-{time.time()}")
    assert tasks.app.control.revoke(early.id, reply=True, limit=1, timeout=10), "no worker replied"
    assert tasks.report.apply_async((50, 0.0), task_id=early.id).id == early.id
    later = tasks.report.apply_async((51, 0.0), countdown=2.0)
    assert tasks.app.control.revoke(later.id, reply=True, limit=1, timeout=10), "no worker replied"
    for n, revoked in ((50, early), (51, later)):
        freed = wait_until(lambda n=n: locked(f"queued:report:{n}") is False, 20)
        assert freed, f"the revoked task's marker still holds report:{n}"
        assert revoked.state == "REVOKED"
        fresh = tasks.report.delay(n, 0.0)
        assert fresh.id != revoked.id
        fresh.get(timeout=20)
        assert [run[0] for run in runs(tasks, f"report:{n}")] == [fresh.id]


def test_an_expired_task_frees_its_key(tasks: Any) -> None:
    expired = tasks.report.apply_async((52, 0.0), expires=datetime.now(UTC) - timedelta(seconds=1))
    assert wait_until(lambda: locked("queued:report:52") is False, 20), "the marker still holds"
    assert expired.state == "REVOKED"
    fresh = tasks.report.delay(52, 0.0)
    assert fresh.id != expired.id
    fresh.get(timeout=20)


# --- groups, chords, callbacks --------------------------------------------------------------------


def test_a_duplicate_whose_own_id_is_awaited_is_refused(tasks: Any) -> None:
    """A group's or chord's members, a chain's steps, a fixed task_id, a link: the caller waits
    on the id it made, so the duplicate cannot be answered with the queued task's; it raises."""
    from celery import chain, chord, group
    from celery.exceptions import ChordError

    from django_redlock.contrib.celery import AlreadyQueued

    with pytest.raises(AlreadyQueued, match=r"\(group_id, task_id\)") as raised:
        group(tasks.report.s(60, 1.0), tasks.report.s(60, 1.0)).apply_async()
    first = tasks.report.AsyncResult(raised.value.task_id)  # the group's first member: sent
    with pytest.raises(AlreadyQueued, match=r"\(group_id, chord, task_id\)"):
        chord([tasks.report.s(60, 1.0), tasks.report.s(61, 0.0)])(tasks.total.s())
    with pytest.raises(AlreadyQueued, match=r"\(task_id\)"):
        tasks.report.apply_async((60,), task_id="mine")
    with pytest.raises(AlreadyQueued, match=r"\(link\)"):
        tasks.report.apply_async((60,), link=tasks.total.s())
    assert tasks.report.delay(60).id == first.id  # a plain delay() still gets it
    assert first.get(timeout=20).startswith("report 60 by")
    assert [run[0] for run in runs(tasks, "report:60")] == [first.id]
    # A chain's later step and a chord's body are sent by the worker: there too the duplicate
    # fails the chain or the chord, where it left them PENDING forever.
    tasks.report.apply_async((66, 0.0), queue="nowhere")  # queued, and stays so
    with pytest.raises(AlreadyQueued, match="report:66"):
        chain(tasks.total.si([1]), tasks.report.si(66, 0.0)).apply_async().get(timeout=20)
    with pytest.raises(ChordError, match="report:66"):
        chord([tasks.total.si([1])])(tasks.report.si(66, 0.0)).get(timeout=20)
    # Without duplicates, groups and chords of RedlockTasks run as usual.
    assert len(group(tasks.report.s(62, 0.0), tasks.report.s(63, 0.0))().get(timeout=20)) == 2
    assert (
        chord([tasks.report.s(64, 0.0), tasks.report.s(65, 0.0)])(tasks.total.s()).get(timeout=20)
        == 2
    )


# --- a task's message delivered again -------------------------------------------------------------


def test_a_task_redelivered_after_its_worker_died_runs_its_body(tasks: Any) -> None:
    """acks_late with reject_on_worker_lost: kill -9 of the process running it gives its message
    back; the redelivery finds the run lock still held under its own id (the dead run's lease):
    it waits for that lease to lapse (lock_ttl = 1 s), then runs the body, once."""
    result = tasks.redelivered.delay(1, 30.0)
    os.kill(started_pid(tasks, "redelivered:1"), signal.SIGKILL)
    started_pid(tasks, "redelivered:1")  # delivered again, and started
    assert result.get(timeout=30) == "done"
    assert [run[0] for run in runs(tasks, "redelivered:1")] == [result.id]


def test_a_second_message_under_a_running_tasks_id_does_nothing(tasks: Any) -> None:
    """The same message twice while the first runs (a broker's redelivery past its visibility
    timeout; here sent by hand): the second waits for the run lock held under its own id, which
    is renewed, and then does nothing (Celery's Ignore: no result of its own). The first's result
    stands; before, the second stored None as a success while the first still ran."""
    result = tasks.redelivered.delay(2, 30.0)
    started_pid(tasks, "redelivered:2")
    tasks.app.send_task(tasks.redelivered.name, (2, 30.0), task_id=result.id)
    ignored = f"[{result.id}]: key 'redelivered:2': a run of this very task id holds it, and"
    assert wait_until(lambda: ignored in WORKER_LOG[0].read_text(), 20), "the second ran or hangs"
    assert result.state == "PENDING"  # nothing stored for the first, nothing for the second
    client = _broker(tasks)
    client.rpush("go:redelivered:2", 1)
    client.close()
    assert result.get(timeout=20) == "done"
    assert [run[0] for run in runs(tasks, "redelivered:2")] == [result.id]


@pytest.mark.parametrize(("name", "n"), [("redelivered", 3), ("redelivered_waiting", 4)])
def test_a_second_message_whose_task_ends_while_it_waits_does_nothing(
    tasks: Any, name: str, n: int
) -> None:
    """The same, but the first run ends while the second waits for its lock: the second finds
    the first's done marker and does nothing, where it would have run the body again (also
    with lock_busy="wait", which waits for any holder)."""
    task = getattr(tasks, name)
    result = task.delay(n, 30.0)
    started_pid(tasks, f"redelivered:{n}")
    tasks.app.send_task(task.name, (n, 30.0), task_id=result.id)
    # The second waits (marked queued: the first removed its own marker when it started).
    assert wait_until(lambda: locked(f"queued:redelivered:{n}"), 20), "the second never waited"
    client = _broker(tasks)
    client.rpush(f"go:redelivered:{n}", 1)
    client.close()
    assert result.get(timeout=20) == "done"
    ignored = f"[{result.id}]: key 'redelivered:{n}': a run of this very task id has run"
    assert wait_until(lambda: ignored in WORKER_LOG[0].read_text(), 20), "the second ran again"
    assert [run[0] for run in runs(tasks, f"redelivered:{n}")] == [result.id]


# --- bad options, at decoration -------------------------------------------------------------------


@pytest.fixture
def finalized_app() -> Any:
    from celery import Celery

    app = Celery("bad-options", broker="memory://")
    app.finalize()
    return app


def test_a_lock_key_naming_no_argument_fails_at_decoration(finalized_app: Any) -> None:
    from django_redlock.contrib.celery import RedlockTask

    def build(user_id: int) -> None: ...

    with pytest.raises(ValueError, match=r"names \{usr\}, which is not a parameter of .*build"):
        finalized_app.task(base=RedlockTask, lock_key="report:{usr}", shared=False)(build)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "needs lock_key"),
        ({"lock_key": "k", "lock_busy": "queue"}, "lock_busy must be one of"),
        ({"lock_key": "k", "lock_ttl": 0}, "ttl must be > 0"),
        ({"lock_key": "k", "lock_queue_timeout": -1}, "lock_queue_timeout must be > 0"),
    ],
)
def test_bad_options_fail_at_decoration(finalized_app: Any, options: Any, message: str) -> None:
    from django_redlock.contrib.celery import RedlockTask

    def job() -> None: ...

    with pytest.raises(ValueError, match=message):
        finalized_app.task(base=RedlockTask, shared=False, **options)(job)


def test_runs_and_skips_are_counted_per_task_name(tasks: Any) -> None:
    """Counted where the task runs (here: called in this process, as a worker would)."""
    from tests.test_signals_metrics import sample

    def count(outcome: str) -> float:
        return sample("redlock_job_runs_total", job=tasks.busy_skip.name, outcome=outcome)

    ran, skipped = count("ran"), count("skipped")
    assert tasks.busy_skip(7) == "ran"
    outcome: list[Any] = []
    with redlock("busy:7", ttl=10):  # held here; the task runs in a thread of its own
        other = threading.Thread(target=lambda: outcome.append(tasks.busy_skip(7)))
        other.start()
        other.join()
    assert outcome == [None]
    assert count("ran") - ran == 1
    assert count("skipped") - skipped == 1
