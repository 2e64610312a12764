"""Guarded management commands: the mixin, ``redlock_run``, real subprocesses and real masters.

The demo's ``nightly_report`` (``GuardedCommandMixin``) is the slow command under test; Django's
``check`` stands for a third-party command that knows nothing about locks.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from django_redlock import redlock
from django_redlock.commands import (
    EXIT_HELD,
    EXIT_LOST,
    EXIT_UNAVAILABLE,
    GuardedCommandMixin,
    command_resource,
)
from django_redlock.conf import get_redlock
from django_redlock.testing.masters import LocalMaster
from tests.conftest import manage_py, wait_until

ROOT = Path(__file__).resolve().parent.parent


def lock_keys(masters: list[LocalMaster], resource: str) -> list[bytes | None]:
    key = get_redlock().lock_key(resource)
    return [m.call("GET", key) for m in masters]


def wipe(masters: list[LocalMaster], resource: str) -> None:
    """Delete a lock everywhere, as a force release or a flushed master would."""
    key = get_redlock().lock_key(resource)
    for m in masters:
        client = m.client()
        try:
            client.delete(key)
        finally:
            client.close()


class HeldElsewhere:
    """Hold ``resource`` from another thread (the holder's own thread would re-enter it)."""

    def __init__(self, resource: str) -> None:
        self.resource = resource
        self._taken = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._hold)

    def _hold(self) -> None:
        with redlock(self.resource, label="test holder"):
            self._taken.set()
            self._done.wait(30)

    def __enter__(self) -> HeldElsewhere:
        self._thread.start()
        assert self._taken.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(10)


# --- in-process: call_command --------------------------------------------------------------------


def test_the_mixin_defines_no_check() -> None:
    assert "check" not in vars(GuardedCommandMixin)


def test_command_resource_is_bounded() -> None:
    assert command_resource("nightly_report") == "command:nightly_report"
    assert len(command_resource("x" * 1000)) == 200
    with pytest.raises(ValueError, match="command name"):
        command_resource("")


@pytest.mark.django_db
def test_guarded_command_runs_under_its_lock_and_releases(redlock_settings: list) -> None:
    seen_during: list[list[bytes | None]] = []
    out = io.StringIO()

    def look() -> None:  # while the command runs (once it took its lock: a loaded start-up)
        def held() -> list[bytes | None] | None:
            keys = lock_keys(redlock_settings, "command:nightly_report")
            return keys if all(v is not None for v in keys) else None

        keys = wait_until(held, 10) or lock_keys(redlock_settings, "command:nightly_report")
        seen_during.append(keys)  # type: ignore[arg-type]  # (wait_until: object)

    looker = threading.Thread(target=look)
    looker.start()
    call_command("nightly_report", "--seconds", "0.8", stdout=out)
    looker.join()
    assert "nightly report: done" in out.getvalue()
    assert all(v is not None and b'"label":"manage.py nightly_report"' in v for v in seen_during[0])
    assert lock_keys(redlock_settings, "command:nightly_report") == [None] * 5


def test_guarded_command_refuses_when_held_elsewhere(redlock_settings: list) -> None:
    with HeldElsewhere("command:nightly_report"), pytest.raises(CommandError) as raised:
        call_command("nightly_report", "--seconds", "0")
    assert raised.value.returncode == EXIT_HELD
    message = str(raised.value)
    assert "nightly_report not started" in message
    assert f"pid {os.getpid()}" in message  # names the holder...
    assert "label 'test holder'" in message
    assert "on 5 of 5 masters" in message


def test_redlock_run_refuses_a_third_party_command_held_elsewhere(redlock_settings: list) -> None:
    with HeldElsewhere("command:check"), pytest.raises(CommandError) as raised:
        call_command("redlock_run", "--", "check")
    assert raised.value.returncode == EXIT_HELD
    assert "check not started: lock 'command:check' is held" in str(raised.value)


def test_redlock_run_custom_key_and_wait(redlock_settings: list) -> None:
    out = io.StringIO()
    with HeldElsewhere("nightly"):
        began = time.monotonic()
        with pytest.raises(CommandError, match="'nightly' is held"):
            call_command("redlock_run", "--key", "nightly", "--wait", "0.3", "--", "check")
        assert time.monotonic() - began >= 0.25  # it kept trying for --wait
        call_command("redlock_run", "--", "check", stdout=out)  # default key: not held
    assert "no issues" in out.getvalue()


@pytest.mark.django_db
def test_redlock_run_passes_arguments_and_reenters_a_guarded_command(
    redlock_settings: list,
) -> None:
    """``redlock_run -- nightly_report`` takes the same lock as the command's own mixin: one
    lock, re-entered, not a deadlock with itself. ``--ttl 0.8`` with a 2 s run: auto-extended
    (0.3 s was lost once on a machine at load 10: the watchdog came too late)."""
    out = io.StringIO()
    call_command(
        "redlock_run", "--ttl", "0.8", "--", "nightly_report", "--seconds", "2", stdout=out
    )
    assert "working for 2s" in out.getvalue()
    assert "nightly report: done" in out.getvalue()
    assert lock_keys(redlock_settings, "command:nightly_report") == [None] * 5


@pytest.mark.django_db
def test_redlock_run_reports_a_lock_lost_mid_run(redlock_settings: list) -> None:
    err, out = io.StringIO(), io.StringIO()
    wiper = threading.Timer(0.3, wipe, (redlock_settings, "command:nightly_report"))
    wiper.start()
    try:
        with pytest.raises(CommandError) as raised:
            call_command(
                "redlock_run",
                "--ttl",
                "0.6",
                "--",
                "nightly_report",
                "--seconds",
                "1.2",
                stdout=out,
                stderr=err,
            )
    finally:
        wiper.join()
    assert raised.value.returncode == EXIT_LOST
    report = str(raised.value)
    assert "nightly_report stopped after" in report
    assert "was lost after" in report
    assert "its next database query was refused" in report
    assert "nightly report: done" not in out.getvalue()  # the DB guard stopped its query
    assert "WARNING: nightly_report: lost lock 'command:nightly_report'" in err.getvalue()


@pytest.mark.django_db
def test_a_failing_command_releases_its_lock(redlock_settings: list) -> None:
    with pytest.raises(CommandError, match="unrecognized arguments"):
        call_command("redlock_run", "--", "nightly_report", "--bogus")
    assert lock_keys(redlock_settings, "command:nightly_report") == [None] * 5


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "no_such_command"], "unknown command 'no_such_command'"),
        (["--", "redlock_run", "check"], "cannot guard itself"),
        (["--ttl", "0", "--", "check"], "ttl"),
        (["--wait", "-1", "--", "check"], "wait"),
        (["--ttl", "nan", "--", "check"], "ttl"),
        # What the settings check refuses as REDLOCK['TTL']: one slow master eats the lease.
        (["--ttl", "0.05", "--", "check"], r"--ttl: REDLOCK\['NODE_TIMEOUT'\] \(0.05s\) is not"),
        (["--ttl", "0.05", "--leader", "--", "check"], "--ttl: REDLOCK"),
        # Once ignored in silence: a standby waits until it leads; an empty key named nothing.
        (["--leader", "--wait", "3", "--", "check"], "--leader takes no --wait"),
        (["--key", "", "--", "check"], "--key must not be empty"),
        (["--leader", "--key", "", "--", "check"], "--key must not be empty"),
    ],
)
def test_redlock_run_bad_arguments(redlock_settings: list, args: list[str], message: str) -> None:
    with pytest.raises(CommandError, match=message):
        call_command("redlock_run", *args)


def test_no_quorum_exits_unavailable(settings: Any, fresh_masters: Any) -> None:
    masters = fresh_masters(3)
    settings.REDLOCK = {"NODES": [m.url for m in masters]}
    masters[0].kill()
    masters[1].kill()
    with pytest.raises(CommandError) as raised:
        call_command("redlock_run", "--", "check")
    assert raised.value.returncode == EXIT_UNAVAILABLE
    assert "no quorum" in str(raised.value)


# --- real subprocesses: manage.py redlock_run, as cron runs it -----------------------------------


@pytest.fixture(scope="module")
def database_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("subprocess-db") / "db.sqlite3"


@pytest.fixture
def manage(redlock_settings: list, database_file: Path) -> Iterator[Any]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings_subprocess",
        "REDLOCK_TEST_NODES": ",".join(m.url for m in redlock_settings),
        "REDLOCK_TEST_DB": str(database_file),
        "PYTHONPATH": str(ROOT),
    }
    started: list[subprocess.Popen[str]] = []

    def start(*args: str, extra: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env={**env, **(extra or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    if not database_file.exists():
        done = start("migrate", "--verbosity", "0")
        assert done.wait(60) == 0, done.communicate()[1]
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def wait_for_line(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> str:
    """Read stdout until a line containing ``text`` (the process is then inside its lock)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if text in line:
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no line with {text!r}; exit {proc.poll()}: {proc.communicate()}")


def test_subprocess_refused_while_this_process_holds_the_lock(manage: Any) -> None:
    with redlock("command:check", label="the test process"):
        proc = manage("redlock_run", "--", "check")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == EXIT_HELD, err
        assert "check not started: lock 'command:check' is held by another process" in err
        assert "label 'the test process'" in err
    proc = manage("redlock_run", "--", "check")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "no issues" in out


def test_two_cron_runs_at_once_only_one_works(manage: Any) -> None:
    # 10 s: the second run must start Python and Django while the first still works; on a
    # loaded machine that once took over 3 s, and the second found the job done and ran it.
    # A 0.5 s node budget: the second must be told "held" by a quorum, not miss 50 ms (four of
    # five masters did, once, beside two CPU burners).
    budget = {"REDLOCK_TEST_NODE_TIMEOUT": "0.5"}
    first = manage("redlock_run", "--", "nightly_report", "--seconds", "10", extra=budget)
    wait_for_line(first, "working for 10s")
    second = manage("redlock_run", "--", "nightly_report", "--seconds", "10", extra=budget)
    out, err = second.communicate(timeout=60)
    assert second.returncode == EXIT_HELD, err
    assert "nightly_report not started" in err
    assert f"pid {first.pid}" in err  # the holder, by name
    assert "working for" not in out
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    assert "nightly report: done" in out


def test_subprocess_exits_70_with_a_report_when_the_lock_is_lost(
    manage: Any, redlock_settings: list
) -> None:
    proc = manage("redlock_run", "--ttl", "1", "--", "nightly_report", "--seconds", "2")
    wait_for_line(proc, "working for 2s")
    wipe(redlock_settings, "command:nightly_report")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_LOST, err
    assert "WARNING: nightly_report: lost lock 'command:nightly_report'" in err
    assert "nightly_report stopped after" in err
    assert "nightly report: done" not in out  # its query after the loss was refused


@pytest.mark.parametrize(
    ("nodes", "check_id"), [("", "django_redlock.E001"), ("not a url", "django_redlock.E003")]
)
@pytest.mark.parametrize(
    "command", [["nightly_report", "--seconds", "0"], ["redlock_run", "--", "check"]]
)
def test_a_guarded_command_with_bad_settings_says_the_check_message(
    tmp_path, nodes, check_id, command
):
    """As a plain command does: the system-check message and exit status 1, no traceback (the
    mixin takes its lock before Django would run the checks)."""
    result = manage_py(*command, env={"REDLOCK_NODES": nodes, "REDLOCK_DEMO_DIR": str(tmp_path)})
    assert result.returncode == 1
    assert "SystemCheckError: System check identified some issues" in result.stderr
    assert f"({check_id})" in result.stderr
    assert "Traceback" not in result.stderr


# --- redlock_run of a command guarded with bounds of its own -----------------------------------


def test_redlock_run_keeps_the_commands_own_at_least(manage: Any, tmp_path: Path) -> None:
    """``redlock_run -- slotjob`` of a command whose class says ``lock_at_least = 20``: its guard
    re-enters redlock_run's lock (taken with no bounds), and the lock is kept until 20 s after
    that entry all the same (long: the copy is a second Python start on a loaded machine). A
    copy started after the first ended skips (75): the job ran once. (The outer entry's bounds
    alone were kept: exit statuses [0, 0], two runs.)"""
    runs = tmp_path / "runs.log"
    bounds = {"SLOTJOB_AT_LEAST": "20"}
    first = manage("redlock_run", "--", "slotjob", "--log", str(runs), extra=bounds)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    second = manage("redlock_run", "--", "slotjob", "--log", str(runs), extra=bounds)
    out, err = second.communicate(timeout=60)
    assert second.returncode == EXIT_HELD, err
    assert "finished, held until" in err
    assert len(runs.read_text().splitlines()) == 1


def test_redlock_run_keeps_the_commands_own_at_most(manage: Any, tmp_path: Path) -> None:
    """``lock_at_most = 2`` on the command, run as ``redlock_run -- slotjob`` for 4 s: the lock
    is not held past 2 s after the command's entry, and the run is told (70). (The inner
    ``at_most`` was dropped: exit 0, the lock renewed to the end.)"""
    runs = tmp_path / "runs.log"
    proc = manage(
        "redlock_run",
        "--",
        "slotjob",
        "--log",
        str(runs),
        "--seconds",
        "4",
        extra={"SLOTJOB_AT_MOST": "2"},
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_LOST, err
    assert "WARNING: slotjob: lost lock 'command:slotjob'" in err


def test_redlock_run_bounds_that_contradict_the_commands_own_are_a_usage_error(
    manage: Any, tmp_path: Path
) -> None:
    """``redlock_run --at-least 5 -- slotjob`` of a command whose own ``lock_at_most`` is 2: the
    lock cannot be kept 5 s and held at most 2 s. Refused before the command runs, exit 2 with
    the reason (it was a traceback)."""
    runs = tmp_path / "runs.log"
    proc = manage(
        "redlock_run",
        "--at-least",
        "5",
        "--",
        "slotjob",
        "--log",
        str(runs),
        extra={"SLOTJOB_AT_MOST": "2"},
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert "slotjob not started: lock 'command:slotjob' re-entered with" in err
    assert "Traceback" not in err
    assert not runs.exists()
