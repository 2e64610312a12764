"""``@unique_task`` (django_redlock/contrib/tasks.py) on the ``django-tasks`` backport's database
backend, with two real ``manage.py db_worker`` processes and the five lock masters: the test
process enqueues, as a web server would, into the same SQLite file (``tests/settings_tasks.py``).
Tasks: ``tests/django_tasks_jobs.py``; they record their runs in a Redis of the module's own."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone
from django_tasks import TaskResultStatus, task

from django_redlock import is_locked, redlock
from django_redlock.contrib.tasks import (
    QUEUED,
    RUNNING,
    AlreadyQueued,
    UniqueTask,
    _holder,
    _label,
    _named,
    _remove,
    unique_task,
)
from django_redlock.testing.masters import LocalMaster, free_port, local_masters
from tests.conftest import ROOT, wait_until

WORKERS = ("w0", "w1")
READY_TIMEOUT = 60


class Workers:
    """Two ``db_worker`` processes (``w0``, ``w1``), started again when a test killed one."""

    def __init__(self, base: Path, env: dict[str, str]) -> None:
        self.base, self.env = base, env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def log(self, name: str) -> Path:
        return self.base / f"{name}.log"

    def ensure(self) -> None:
        started = [n for n in WORKERS if n not in self.procs or self.procs[n].poll() is not None]
        for name in started:
            with self.log(name).open("w") as log:
                self.procs[name] = subprocess.Popen(  # noqa: S603
                    [sys.executable, "manage.py", "db_worker", "--interval", "0.05",
                     "--no-startup-delay", "--no-reload", "--worker-id", name],
                    cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT
        for name in started:
            while "Starting worker" not in self.log(name).read_text():
                assert self.procs[name].poll() is None, self.log(name).read_text()
                assert time.monotonic() < deadline, self.log(name).read_text()
                time.sleep(0.05)

    def kill(self, name: str) -> None:
        self.procs[name].kill()  # SIGKILL: no handler, no cleanup
        self.procs[name].wait()

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@contextlib.contextmanager
def on_tasks_database(path: Path) -> Iterator[None]:
    """This thread's ``default`` connection on the workers' SQLite file, the test database's
    put back after (never closed: an in-memory database closed is gone)."""
    from django.db import connections
    from django.db.utils import ConnectionHandler, load_backend

    from tests import settings_tasks

    conf = ConnectionHandler().configure_settings(
        {"default": {**settings_tasks.TASKS_DATABASE, "NAME": str(path)}}
    )["default"]
    previous = connections["default"]
    mine = load_backend(conf["ENGINE"]).DatabaseWrapper(conf, "default")
    connections["default"] = mine
    try:
        yield
    finally:
        mine.close()
        connections["default"] = previous


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMaster]:
    with local_masters(1, tmp_path_factory.mktemp("recorder")) as (master,):
        yield master


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
    recorder: LocalMaster,
    _shared_masters: dict[int, list[LocalMaster]],
    django_db_blocker: Any,
) -> Iterator[tuple[ModuleType, Workers, Path]]:
    """The database file (migrated), the workers, and this process on the same settings."""
    from tests import settings_tasks

    base = tmp_path_factory.mktemp("django_tasks")
    db = base / "tasks.sqlite3"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_tasks",
        "REDLOCK_TEST_NODES": ",".join(m.url for m in _shared_masters[5]),
        "REDLOCK_TEST_DB": str(db),
        "REDLOCK_TEST_RECORDER": recorder.url,
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }
    migrated = subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", "migrate", "django_tasks_database", "--noinput"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert migrated.returncode == 0, migrated.stderr
    workers = Workers(base, env)
    os.environ["REDLOCK_TEST_RECORDER"] = recorder.url
    # Installing apps runs every app's ready() again, and the admin's registers the backend's
    # model in the one admin site: unregistered after, or the admin pages of the tests that run
    # later in this process fail on an app that is no longer installed.
    from django.contrib import admin

    registered = dict(admin.site._registry)
    try:
        with (
            override_settings(
                INSTALLED_APPS=settings_tasks.INSTALLED_APPS, TASKS=settings_tasks.TASKS
            ),
            django_db_blocker.unblock(),
            on_tasks_database(db),
        ):
            from tests import django_tasks_jobs

            workers.ensure()
            yield django_tasks_jobs, workers, db
    finally:
        workers.stop()
        os.environ.pop("REDLOCK_TEST_RECORDER", None)
        admin.site._registry.clear()
        admin.site._registry.update(registered)


@pytest.fixture
def jobs(
    world: tuple[ModuleType, Workers, Path],
    redlock_settings: list[LocalMaster],
    recorder: LocalMaster,
) -> ModuleType:
    module, workers, _ = world
    workers.ensure()  # a test before may have killed one
    recorder.client().flushall()
    return module


@pytest.fixture
def workers(world: tuple[ModuleType, Workers, Path]) -> Workers:
    return world[1]


def runs(recorder: LocalMaster, key: str) -> list[list[str]]:
    return [r.decode().split() for r in recorder.client().lrange(f"runs:{key}", 0, -1)]


def started_pid(recorder: LocalMaster, key: str, timeout: float = 30) -> int:
    reply = recorder.client().blpop([f"started:{key}"], timeout=timeout)
    assert reply is not None, f"{key} never started"
    return int(reply[1])


def finished(result: Any, timeout: float = 30) -> Any:
    def done() -> bool:
        result.refresh()
        return bool(result.is_finished)

    assert wait_until(done, timeout, step=0.05), f"{result.id} is still {result.status}"
    return result


def claimed(result: Any, timeout: float = 30) -> Any:
    """``result`` once a worker claimed it (RUNNING): its run started, or waits for its key."""

    def running() -> bool:
        result.refresh()
        return bool(result.status == TaskResultStatus.RUNNING)

    assert wait_until(running, timeout, step=0.02), f"{result.id} is {result.status}"
    return result


def lease_ttls(masters: list[LocalMaster], resource: str) -> list[int]:
    """The remaining lease of ``resource``'s lock on each master, in ms (-2: no key)."""
    from django_redlock.conf import get_redlock

    name = get_redlock().lock_key(resource)
    return [m.client().pttl(name) for m in masters]


# --- unique at enqueue ---------------------------------------------------------------------------


def test_a_duplicate_enqueue_returns_the_existing_result(jobs: Any, recorder: LocalMaster) -> None:
    first = jobs.report.enqueue(1, 1.0)
    queued = jobs.report.enqueue(1, 1.0)  # most likely still queued
    assert queued.id == first.id
    started_pid(recorder, "report:1")
    running = [jobs.report.enqueue(1, 1.0) for _ in range(5)]  # running now
    assert {r.id for r in running} == {first.id}
    assert finished(first).status == TaskResultStatus.SUCCESSFUL
    assert first.return_value.startswith("report 1 by")
    assert len(runs(recorder, "report:1")) == 1  # one execution
    # Finished: the key is free, and the next enqueue is a new task that runs again.
    assert not is_locked("report:1")
    assert not is_locked("queued:report:1")
    again = jobs.report.enqueue(1, 0.0)
    assert again.id != first.id
    assert finished(again).status == TaskResultStatus.SUCCESSFUL
    assert len(runs(recorder, "report:1")) == 2


def test_the_key_is_made_from_the_arguments_as_the_worker_gets_them(
    jobs: Any, recorder: LocalMaster
) -> None:
    """The backend stores arguments as JSON: a tuple comes back to the worker a list. The key
    the enqueue marks and the key the worker locks must be the same one."""
    first = jobs.report.enqueue((7, 8), 1.0)
    started_pid(recorder, "report:[7, 8]")
    assert is_locked("report:[7, 8]")
    assert not is_locked("queued:report:[7, 8]")  # removed by the worker...
    assert not is_locked("queued:report:(7, 8)")  # ...and never another name
    assert jobs.report.enqueue((7, 8), 1.0).id == first.id
    finished(first)


def test_concurrent_enqueues_from_threads_store_one_task(
    jobs: Any, recorder: LocalMaster, world: tuple[ModuleType, Workers, Path]
) -> None:
    ids: list[str] = []

    def enqueue() -> None:
        with on_tasks_database(world[2]):
            ids.extend(jobs.report.enqueue(3, 0.5).id for _ in range(3))

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 24
    assert len(set(ids)) == 1
    finished(jobs.report.get_result(ids[0]))
    assert len(runs(recorder, "report:3")) == 1


def test_a_run_after_enqueue_stays_unique_until_it_runs(
    jobs: Any, recorder: LocalMaster, redlock_settings: list[LocalMaster]
) -> None:
    """``later`` has lock_queue_timeout = 1 s: a marker that lived only that long would lapse
    before run_after, and a second enqueue would store a second task."""
    run_after = timezone.now() + timedelta(seconds=2.5)
    first = jobs.later.using(run_after=run_after).enqueue(1)
    assert min(lease_ttls(redlock_settings, "queued:later:1")) > 2000  # past run_after, then 1 s
    assert jobs.later.enqueue(1).id == first.id
    assert first.status == TaskResultStatus.READY
    assert finished(first).status == TaskResultStatus.SUCCESSFUL
    assert first.started_at >= run_after
    assert len(runs(recorder, "later:1")) == 1
    again = jobs.later.enqueue(1)
    assert again.id != first.id
    finished(again)


def test_a_failed_task_frees_its_key(jobs: Any) -> None:
    first = jobs.failing.enqueue(1)
    assert finished(first).status == TaskResultStatus.FAILED
    assert first.errors[0].exception_class_path == "builtins.RuntimeError"
    assert not is_locked("fail:1")
    assert not is_locked("queued:fail:1")
    assert jobs.failing.enqueue(1).id != first.id


def test_a_marker_whose_result_ended_or_was_deleted_is_not_believed(jobs: Any) -> None:
    """A queued task that ends without running (FAILED by an operator or by a task path that no
    longer imports), or whose result is deleted, leaves its marker behind: the next enqueue
    sees that its result may not run any more, removes it, and stores a new task."""
    from django_tasks_db.models import DBTaskResult

    parked = jobs.report.using(queue_name="nowhere")
    first = parked.enqueue(5)
    assert parked.enqueue(5).id == first.id
    DBTaskResult.objects.filter(id=first.id).update(status=TaskResultStatus.FAILED)
    assert is_locked("queued:report:5")  # still marked...
    second = parked.enqueue(5)
    assert second.id != first.id  # ...but not believed
    assert parked.enqueue(5).id == second.id
    DBTaskResult.objects.filter(id=second.id).delete()
    third = parked.enqueue(5)
    assert third.id not in {first.id, second.id}
    assert parked.enqueue(5).id == third.id


def test_an_enqueue_inside_a_transaction_says_it_is_not_unique_there(
    jobs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Until the transaction commits, no other process can read the stored task: its marker
    names a result that looks deleted. Said, since it cannot be kept."""
    from django.db import transaction

    with caplog.at_level("WARNING", logger="django_redlock"), transaction.atomic():
        jobs.report.using(queue_name="nowhere").enqueue(6)
    assert "inside transaction.atomic()" in caplog.text
    assert "transaction.on_commit" in caplog.text


def test_a_task_can_enqueue_its_own_next_run(jobs: Any, recorder: LocalMaster) -> None:
    """While it runs, a task's key is held by itself: its own enqueue of the same key is the
    next run, not a duplicate of the running one (which would never run again)."""
    first = jobs.chain.enqueue(1, 2)
    second_id = finished(first).return_value
    assert second_id != first.id
    second = finished(jobs.chain.get_result(second_id))
    assert second.return_value not in {first.id, second_id}
    assert finished(jobs.chain.get_result(second.return_value)).return_value == "last"
    assert len(runs(recorder, "chain:1")) == 3


def test_a_duplicate_can_raise(jobs: Any) -> None:
    first = jobs.strict.enqueue(1)
    with pytest.raises(AlreadyQueued, match=first.id) as raised:
        jobs.strict.enqueue(1)
    assert raised.value.result_id == first.id


def test_the_context_names_the_running_result(jobs: Any, recorder: LocalMaster) -> None:
    first = jobs.with_context.enqueue(1, 1.0)
    started_pid(recorder, "context:1")
    assert jobs.with_context.enqueue(1, 1.0).id == first.id  # found by its run lock's label
    assert finished(first).return_value == first.id


def test_a_coroutine_task_runs_under_the_same_locks(jobs: Any, recorder: LocalMaster) -> None:
    first = jobs.async_report.enqueue(1, 1.0)
    started_pid(recorder, "async:1")
    assert is_locked("async:1")
    assert jobs.async_report.enqueue(1, 1.0).id == first.id
    assert finished(first).return_value == "async ran"
    assert not is_locked("async:1")
    assert len(runs(recorder, "async:1")) == 1


# --- the run lock --------------------------------------------------------------------------------


def test_a_worker_killed_mid_task_frees_the_key_within_its_ttl(
    jobs: Any, recorder: LocalMaster, workers: Workers, redlock_settings: list[LocalMaster]
) -> None:
    """kill -9 of the worker running the task: the run lock (lock_ttl = 1 s, renewed while the
    task ran) lapses within its TTL, and the key can run again. (The backend leaves the killed
    task's result RUNNING for ever: nothing in django-tasks-db notices a dead worker.)"""
    first = jobs.report.enqueue(2, 30.0)
    pid = started_pid(recorder, "report:2")
    assert is_locked("report:2")
    assert not is_locked("queued:report:2")  # the worker removed the marker when it started
    (name,) = claimed(first).worker_ids
    assert workers.procs[name].pid == pid
    workers.kill(name)
    # Every master lets the key go within lock_ttl: no poll's timing on a loaded machine decides.
    assert all(t == -2 or 0 <= t <= 1000 for t in lease_ttls(redlock_settings, "report:2"))
    assert wait_until(lambda: not is_locked("report:2"), 10)
    fresh = jobs.report.enqueue(2, 0.0)
    assert fresh.id != first.id
    assert finished(fresh).status == TaskResultStatus.SUCCESSFUL  # by the other worker
    first.refresh()
    assert first.status == TaskResultStatus.RUNNING


def test_a_worker_killed_while_it_waits_for_the_key_frees_it_within_ttl_plus_wait(
    jobs: Any, workers: Workers, redlock_settings: list[LocalMaster]
) -> None:
    """``lock_busy="wait"``: until it holds the run lock, the worker is kept by the marker, whose
    lease it cuts to twice lock_ttl + lock_wait (2 + 2 s) when it starts: killed then, the key is
    free again within those 4 s, not after lock_queue_timeout (an hour)."""
    with redlock("busy:9", ttl=30):
        first = jobs.busy_wait_briefly.enqueue(9)
        (name,) = claimed(first).worker_ids
        assert wait_until(
            lambda: 0 < max(lease_ttls(redlock_settings, "queued:busy:9")) <= 4000, 10
        )
        workers.kill(name)
        assert all(t == -2 or 0 <= t <= 4000 for t in lease_ttls(redlock_settings, "queued:busy:9"))
        assert wait_until(lambda: not is_locked("queued:busy:9"), 10)
        fresh = jobs.busy_wait_briefly.enqueue(9)
        assert fresh.id != first.id
    finished(fresh)


def test_a_result_run_again_waits_out_its_own_earlier_attempt(
    jobs: Any, recorder: LocalMaster
) -> None:
    """A result run a second time (its first worker died, and it was queued again) finds the
    key held by its own first attempt, for lock_ttl at most: it waits that out and runs, rather
    than skip itself."""
    from django_tasks_db.models import DBTaskResult

    first = jobs.report.using(queue_name="nowhere").enqueue(4, 0.0)
    from django_redlock.conf import get_redlock

    # What the dead first attempt left: the run lock naming this result, for lock_ttl (1 s).
    get_redlock().lock("report:4", ttl=1.0, label=RUNNING + first.id).acquire()
    DBTaskResult.objects.filter(id=first.id).update(queue_name="default")  # queued again
    assert finished(first).status == TaskResultStatus.SUCCESSFUL
    assert first.return_value is not None  # it ran: None is what a skipped run returns
    assert len(runs(recorder, "report:4")) == 1


def test_a_busy_key_is_skipped(jobs: Any, recorder: LocalMaster) -> None:
    with redlock("busy:1", ttl=10):
        result = finished(jobs.busy_skip.enqueue(1))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value is None
    assert runs(recorder, "busy:1") == []


def test_a_busy_key_can_fail_the_task(jobs: Any, recorder: LocalMaster) -> None:
    with redlock("busy:2", ttl=10):
        result = finished(jobs.busy_raise.enqueue(2))
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path.endswith("LockContended")
    assert runs(recorder, "busy:2") == []


def test_a_busy_key_is_waited_for_and_stays_unique_meanwhile(
    jobs: Any, recorder: LocalMaster
) -> None:
    holder = redlock("busy:3", ttl=10)
    holder.acquire()
    result = claimed(jobs.busy_wait.enqueue(3))  # claimed: it waits in its worker
    assert jobs.busy_wait.enqueue(3).id == result.id
    assert runs(recorder, "busy:3") == []
    released = time.time()
    holder.release()
    assert finished(result).return_value == "ran"
    ((_, began, _),) = runs(recorder, "busy:3")
    assert float(began) >= released - 0.05  # (wall clocks of one machine: a small allowance)


# --- ids, whatever their characters --------------------------------------------------------------


@pytest.mark.parametrize(
    "result_id",
    ["plain-uuid-like", "with spaces in it", f"{QUEUED}nested", 'ü "quoted" {x} \n', "x" * 150],
)
def test_a_result_id_reads_back_verbatim(redlock_of: Any, masters: Any, result_id: str) -> None:
    """The backend picks ids (a custom ``id_function`` may make any string): the marker's label
    gives back exactly the id, and removing another id's marker leaves it alone."""
    engine = redlock_of(masters)
    label = _label(QUEUED, result_id)
    assert label is not None
    engine.lock("queued:k", ttl=10, label=label).acquire()
    held = _holder(engine, "queued:k")
    assert held is not None
    assert _named(held, QUEUED) == result_id
    _remove(engine, "queued:k", QUEUED + result_id + " ")
    _remove(engine, "queued:k", QUEUED + result_id[:-1])
    assert engine.holder("queued:k") is not None
    _remove(engine, "queued:k", label)
    assert engine.holder("queued:k") is None


def test_an_id_too_long_for_a_label_is_not_named() -> None:
    assert _label(RUNNING, "x" * 500) is None


# --- the immediate backend: the run lock, in the caller's process --------------------------------


def immediate_holder(n: int) -> str:
    """Returns the label of the lock that holds its key while it runs."""
    from django_redlock.conf import get_redlock

    held = get_redlock().holder(f"immediate:{n}")
    return held.owner.label if held is not None and held.owner.label else ""


def test_the_immediate_backend_runs_under_the_lock_named_for_its_result(
    redlock_settings: list[LocalMaster],
) -> None:
    """The immediate backend has run the task when ``enqueue`` returns and cannot read results
    back: there is nothing to be unique against, and only the run lock applies."""
    with override_settings(
        TASKS={"default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}}
    ):
        job = unique_task(lock_key="immediate:{n}")(task()(immediate_holder))
        result = job.enqueue(1)
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.return_value == RUNNING + result.id
        with redlock("immediate:2", ttl=10):
            skipped = job.enqueue(2)
        assert skipped.status == TaskResultStatus.SUCCESSFUL
        assert skipped.return_value is None  # skipped: the key was busy
        assert job.call(3) == "django task call"  # a direct call names no result
        assert not is_locked("queued:immediate:1")


# --- bad input: at decoration, or before any request ---------------------------------------------


def plain(user_id: int) -> None:
    """A task function for the bad-input tests."""


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"lock_key": "report:{nope}"}, "nope"),
        ({"lock_key": ""}, "lock_key"),
        ({"lock_key": None}, "None"),
        ({"lock_key": "r:{user_id}", "lock_busy": "retry"}, "no retries"),
        ({"lock_key": "r:{user_id}", "lock_busy": "later"}, "'later'"),
        ({"lock_key": "r:{user_id}", "lock_ttl": 0}, "ttl"),
        ({"lock_key": "r:{user_id}", "lock_ttl": -1}, "-1"),
        ({"lock_key": "r:{user_id}", "lock_ttl": math.nan}, "nan"),
        ({"lock_key": "r:{user_id}", "lock_ttl": True}, "True"),
        ({"lock_key": "r:{user_id}", "lock_ttl": "10"}, "'10'"),
        ({"lock_key": "r:{user_id}", "lock_wait": -0.5}, "lock_wait"),
        ({"lock_key": "r:{user_id}", "lock_queue_timeout": 0}, "lock_queue_timeout"),
        ({"lock_key": "r:{user_id}", "lock_unique": "yes"}, "'yes'"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        unique_task(**options)(task()(plain))


def test_unique_task_goes_above_task() -> None:
    with pytest.raises(TypeError, match="goes above @task"):
        unique_task(lock_key="r:{user_id}")(plain)  # type: ignore[arg-type]
    once = unique_task(lock_key="r:{user_id}")(task()(plain))
    assert isinstance(once, UniqueTask)
    with pytest.raises(TypeError, match="unique task already"):
        unique_task(lock_key="r:{user_id}")(once)


def test_using_keeps_the_lock_options() -> None:
    job = unique_task(lock_key="r:{user_id}", lock_ttl=3, lock_busy="wait")(task()(plain))
    moved = job.using(priority=0, run_after=timezone.now() + timedelta(seconds=5))
    assert isinstance(moved, UniqueTask)
    assert (moved.lock_key, moved.lock_ttl, moved.lock_busy) == ("r:{user_id}", 3.0, "wait")


def test_arguments_that_cannot_be_stored_fail_before_any_request(settings: Any) -> None:
    """A dead master address: an error that came from a request would say so."""
    settings.REDLOCK = {"NODES": [f"redis://127.0.0.1:{free_port()}/0"]}
    from tests import settings_tasks

    with override_settings(TASKS=settings_tasks.TASKS):
        job = unique_task(lock_key="r:{user_id}")(task()(plain))
        with pytest.raises(TypeError, match="Unsupported type"):
            job.enqueue(object())
        with pytest.raises(TypeError, match="user_id"):
            job.enqueue(wrong=1)  # type: ignore[call-arg]
