"""One leader across processes: ``manage.py redlock_run --leader -- <command>`` and
``django_redlock.leader()``, on real masters, with real ``kill -9`` and a real partition (the
leader reaches the masters only through proxies that the test blackholes).

No two leaders overlap: the led command (the demo's ``scheduler``) logs "<pid> <time>" at every
tick, and the intervals of the pids never cross."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redlock import QuorumUnavailable, holder
from django_redlock.commands import EXIT_LOST
from django_redlock.conf import get_redlock
from django_redlock.testing.masters import LocalMaster
from django_redlock.testing.proxy import DelayProxy
from tests.conftest import ROOT, wait_until

TTL = 2.0
TICK = 0.02


@pytest.fixture
def leaders(tmp_path: Path, redlock_settings: list[LocalMaster]) -> Iterator[Any]:
    """Start ``redlock_run --leader --ttl 2 -- scheduler`` processes (through ``nodes``, if
    given: URLs of proxies), each logging its ticks to one shared file."""
    started: list[subprocess.Popen[str]] = []
    log = tmp_path / "ticks.log"

    def start(
        nodes: list[str] | None = None, command: tuple[str, ...] | None = None
    ) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings_subprocess",
            "REDLOCK_TEST_NODES": ",".join(nodes or [m.url for m in redlock_settings]),
            "REDLOCK_TEST_DB": str(tmp_path / "db.sqlite3"),
            "PYTHONPATH": str(ROOT),
        }
        proc = subprocess.Popen(  # noqa: S603
            [sys.executable, str(ROOT / "manage.py"), "redlock_run", "--leader", "--key",
             "scheduler", "--ttl", str(TTL), "--",
             *(command or ("scheduler", "--every", str(TICK))), "--log", str(log)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        started.append(proc)
        return proc

    start.log = log  # type: ignore[attr-defined]
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stderr is not None and not proc.stderr.closed:
            proc.stderr.close()


def ticks(log: Path) -> dict[int, list[float]]:
    """Per child pid, the times of its ticks."""
    out: dict[int, list[float]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            pid, at = line.split()
            out.setdefault(int(pid), []).append(float(at))
    return out


def assert_no_overlap(log: Path) -> list[tuple[float, float]]:
    intervals = sorted((t[0], t[-1]) for t in ticks(log).values())
    for (_, end), (start, _) in zip(intervals, intervals[1:], strict=False):
        assert start > end, f"two leaders at once: {intervals}"
    return intervals


def leader_pid() -> int | None:
    """The leader's pid, None if no one leads, or if too few masters answered in time to tell
    (this test process's 50 ms budget, on a loaded machine): the callers poll until it is known."""
    try:
        held = holder("leader:scheduler")
    except QuorumUnavailable:
        return None
    return None if held is None else held.owner.pid


def standby_queued(masters: list[LocalMaster]) -> bool:
    """Whether a standby waits in the leader lock's queue on a majority of ``masters``: it is
    up (a Django start-up in a process of its own, seconds on a loaded machine) and queued."""
    queue_key = get_redlock().queue_key("leader:scheduler")
    return sum(bool(m.call("ZCARD", queue_key)) for m in masters) > len(masters) // 2


def test_a_standby_takes_over_from_a_leader_killed_with_sigkill(
    leaders: Any, redlock_settings: list[LocalMaster]
) -> None:
    first = leaders()
    assert wait_until(lambda: leader_pid() == first.pid and ticks(leaders.log), 30), "first leads"
    standbys = [leaders()]
    assert wait_until(lambda: standby_queued(redlock_settings), 30), "the standby is up, queued"
    assert wait_until(lambda: leader_pid() == first.pid, 5.0)  # (polled: "cannot tell" is None)
    assert len(ticks(leaders.log)) == 1  # only the leader's command runs
    (child,) = ticks(leaders.log)
    os.kill(first.pid, signal.SIGKILL)
    killed = time.monotonic()
    # Within the lease (TTL) and a loaded machine's wake-up; bench/fleet measures it.
    assert wait_until(lambda: leader_pid() in {p.pid for p in standbys}, TTL + 2.0), (
        "a standby takes over"
    )
    assert wait_until(lambda: len(ticks(leaders.log)) == 2, 30), "the new leader's command ticks"
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # the dead leader's command died with it: no orphan works on
    assert time.monotonic() - killed < 30
    assert_no_overlap(leaders.log)


@pytest.mark.parametrize(
    "command",
    [None, ("grandchild_scheduler", "--every", str(TICK), "--ignore-term")],
    ids=["command", "grandchild-ignoring-sigterm"],
)
def test_a_partitioned_leader_stops_its_command_before_its_validity_ends(
    leaders: Any, redlock_settings: list[LocalMaster], command: tuple[str, ...] | None
) -> None:
    """Cut off from every master, the leader stops its command before its validity ends: the
    step-down's SIGTERM, then SIGKILL; a grandchild that ignores SIGTERM is killed in time too."""
    proxies = [DelayProxy(m.port, 0.0).start() for m in redlock_settings]
    try:
        first = leaders([p.url for p in proxies], command=command)
        assert wait_until(lambda: leader_pid() == first.pid and ticks(leaders.log), 30), (
            "first leads"
        )
        second = leaders()
        assert wait_until(lambda: standby_queued(redlock_settings), 30), "the standby is queued"
        for proxy in proxies:
            proxy.blackhole()  # the leader alone is cut off from every master
        assert first.wait(TTL + 5) == EXIT_LOST
        err = first.communicate()[1]
        assert "leadership is running out" in err
        assert wait_until(lambda: leader_pid() == second.pid, TTL + 2.0), "the standby takes over"
        assert wait_until(lambda: len(ticks(leaders.log)) == 2, 30), (
            "the new leader's command ticks"
        )
        intervals = assert_no_overlap(leaders.log)
        assert intervals[1][0] - intervals[0][1] > TTL / 6  # stopped before the lease ended
    finally:
        for proxy in proxies:
            proxy.stop()


def test_leader_in_python_hands_over_on_exit_and_steps_down_before_validity_ends(
    settings: Any, redlock_settings: list[LocalMaster]
) -> None:
    from django_redlock import leader

    proxies = [DelayProxy(m.port, 0.0).start() for m in redlock_settings]
    settings.REDLOCK = {"NODES": [p.url for p in proxies]}
    try:
        order: list[str] = []
        stepped: list[float] = []
        first_leads = threading.Event()
        release_first = threading.Event()

        def first() -> None:
            with leader("py", ttl=TTL) as lead:
                order.append("first")
                first_leads.set()
                release_first.wait(10)
                assert not lead.lost.is_set()

        def second() -> None:
            first_leads.wait(10)
            with leader("py", ttl=TTL, on_step_down=lambda lead: stepped.append(lead.validity)):
                order.append("second")

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        first_leads.wait(10)
        time.sleep(0.3)
        assert order == ["first"]  # the second waits
        handed = time.monotonic()
        release_first.set()
        for t in threads:
            t.join(10)
        assert order == ["first", "second"]
        assert time.monotonic() - handed < TTL / 2  # woken by the release, not by expiry
        # A partitioned leader is told while it still has validity.
        # A partitioned leader is told while it still has validity: stopping then, it never
        # overlaps the next one (and leaving the block raises nothing: it was safe throughout).
        with leader("py", ttl=TTL) as lead:
            for proxy in proxies:
                proxy.blackhole()
            assert lead.lost.wait(TTL + 1)
            assert 0 < lead.validity <= TTL / 3
        assert stepped == []
    finally:
        for proxy in proxies:
            proxy.stop()


def test_leader_is_the_function_even_once_its_module_is_imported() -> None:
    """``redlock_run --leader`` imports ``django_redlock.leadership``; a module named like the
    function would have replaced ``django_redlock.leader`` with itself."""
    import types

    import django_redlock.leadership  # noqa: F401
    from django_redlock import leader

    assert not isinstance(leader, types.ModuleType)
    assert leader.__module__ == "django_redlock.leadership"


# --- what a cron user's led command does: grandchildren, ignored signals, signal deaths -----------


def _dead(pid: int) -> bool:
    """Gone, or a zombie (it runs no more: only its exit status is left to read)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize(
    "how",
    [(), ("--setsid",), ("--ignore-term",)],
    ids=["grandchild", "grandchild-left-the-group", "ignoring-sigterm"],
)
def test_a_leader_killed_with_sigkill_takes_its_commands_grandchild_down(
    leaders: Any, how: tuple[str, ...]
) -> None:
    """The led command starts its scheduler as a subprocess (a wrapper around ``celery beat``).
    ``kill -9`` of the leader: that grandchild stops too, before the standby's starts ticking
    (with ``--setsid`` it left the command's process group; with ``--ignore-term`` both ignore
    SIGTERM). Two schedulers never tick at once."""
    command = ("grandchild_scheduler", "--every", str(TICK), *how)
    first = leaders(command=command)
    assert wait_until(lambda: leader_pid() == first.pid and ticks(leaders.log), 30), "first leads"
    standby = leaders(command=command)
    assert wait_until(lambda: leader_pid() == first.pid, 5.0)
    (grandchild,) = ticks(leaders.log)
    os.kill(first.pid, signal.SIGKILL)
    assert wait_until(lambda: _dead(grandchild), 10), "the grandchild died with its leader"
    assert wait_until(lambda: leader_pid() == standby.pid, TTL + 10), "the standby takes over"
    assert wait_until(lambda: len(ticks(leaders.log)) == 2, 30), "the new leader's ticks"
    assert_no_overlap(leaders.log)


def test_sigterm_to_the_leader_reaches_the_commands_grandchild(leaders: Any) -> None:
    """``systemctl stop`` sends the leader SIGTERM: it is passed on to the command's whole
    process group, the scheduler subprocess included, and the leader exits as the command did
    (143); nothing it started ticks on."""
    first = leaders(command=("grandchild_scheduler", "--every", str(TICK)))
    assert wait_until(lambda: leader_pid() == first.pid and ticks(leaders.log), 30), "first leads"
    (grandchild,) = ticks(leaders.log)
    first.send_signal(signal.SIGTERM)
    assert first.wait(30) == 128 + signal.SIGTERM
    assert _dead(grandchild)


def test_a_keeper_killed_with_sigkill_leaves_the_leader_to_take_the_group_down(
    leaders: Any,
) -> None:
    """``kill -9`` of the keeper itself (the OOM killer's choice): the command dies with it, and
    the leader SIGKILLs the command's process group (the keeper reported it) before it
    releases the lock: the grandchild never ticks beside the standby's."""
    command = ("grandchild_scheduler", "--every", str(TICK))
    first = leaders(command=command)
    assert wait_until(lambda: leader_pid() == first.pid and ticks(leaders.log), 30), "first leads"
    standby = leaders(command=command)
    assert wait_until(lambda: leader_pid() == first.pid, 5.0)
    (grandchild,) = ticks(leaders.log)
    (keeper,) = Path(f"/proc/{first.pid}/task/{first.pid}/children").read_text().split()
    os.kill(int(keeper), signal.SIGKILL)
    assert wait_until(lambda: _dead(grandchild), 10), "the grandchild died with its keeper"
    assert first.wait(30) == 128 + signal.SIGKILL  # its command's keeper was killed so
    assert wait_until(lambda: leader_pid() == standby.pid, 10), "the standby takes over"
    assert wait_until(lambda: len(ticks(leaders.log)) == 2, 30), "the new leader's ticks"
    assert_no_overlap(leaders.log)


def test_a_led_command_that_exits_leaves_nothing_running_when_the_lock_is_released(
    leaders: Any,
) -> None:
    """A command that exits leaving its scheduler subprocess behind: the leader releases the
    lock only once that is gone, so the standby's scheduler never overlaps it."""
    command = ("grandchild_scheduler", "--every", str(TICK), "--exit-after", "1")
    first = leaders(command=command)
    assert wait_until(lambda: ticks(leaders.log), 30), "first ticks"
    # Its ticking grandchild, named before the standby starts: once the first leader has
    # released, the standby's may tick at once, before this test reads the log again.
    (grandchild,) = ticks(leaders.log)
    standby = leaders(command=("grandchild_scheduler", "--every", str(TICK)))
    assert first.wait(30) == 0
    assert _dead(grandchild)
    assert wait_until(lambda: leader_pid() == standby.pid, 10), "the standby takes over"
    assert wait_until(lambda: len(ticks(leaders.log)) == 2, 30)
    assert_no_overlap(leaders.log)


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGKILL, 137), (signal.SIGTERM, 143)])
def test_a_led_command_killed_by_a_signal_exits_as_a_shell_says(
    leaders: Any, signum: int, status: int
) -> None:
    """The led command killed by signal N: the leader exits 128 + N, as a shell reports it (and
    as plain ``redlock_run``, killed so, shows): not ``sys.exit(-N)``, which a shell reads as
    256 - N (247, 241)."""
    first = leaders()
    assert wait_until(lambda: ticks(leaders.log), 30), "the command ticks"
    (command,) = ticks(leaders.log)
    os.kill(command, signum)
    assert first.wait(30) == status
    assert f"killed by signal {int(signum)}" in first.communicate()[1]


def test_a_leader_that_enters_leader_again_is_refused_at_once(redlock_settings: Any) -> None:
    """``leader(name)`` inside ``leader(name)`` on the same thread would wait for itself: it
    raises at once (it used to retry the at-once refusal in a loop with no sleep, forever)."""
    from django_redlock import LockContended, leader

    outcome: list[BaseException | None] = []

    def lead_twice() -> None:
        with leader("twice", ttl=TTL):
            try:
                with leader("twice", ttl=TTL):
                    outcome.append(None)
            except LockContended as error:
                outcome.append(error)

    thread = threading.Thread(target=lead_twice, daemon=True)  # (a spinning one is left behind)
    began = time.monotonic()
    thread.start()
    thread.join(20)
    assert not thread.is_alive(), "leader() re-entered by its leader never returned"
    (error,) = outcome
    assert isinstance(error, LockContended), error
    assert "already held by this same thread" in str(error)
    assert time.monotonic() - began < 20


def test_a_leader_paused_past_its_lease_has_its_command_stopped_by_the_keeper(
    leaders: Any,
) -> None:
    """The leader stopped (SIGSTOP; Ctrl-Z in its terminal, a frozen VM) past its lease: it can
    neither renew nor stop its command, and a standby takes over. The keeper holds the
    leader's validity (sent at every renewal) and kills the command's processes before it
    ends: the paused leader's scheduler never ticks beside the standby's."""
    command = ("grandchild_scheduler", "--every", str(TICK))
    first = leaders(command=command)
    assert wait_until(lambda: leader_pid() == first.pid and ticks(leaders.log), 30), "first leads"
    standby = leaders(command=command)
    assert wait_until(lambda: leader_pid() == first.pid, 5.0)
    (grandchild,) = ticks(leaders.log)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        assert wait_until(lambda: leader_pid() == standby.pid, TTL + 10), "the standby takes over"
        assert wait_until(lambda: len(ticks(leaders.log)) == 2, 30), "the new leader's ticks"
        assert _dead(grandchild)
        assert_no_overlap(leaders.log)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(30) == EXIT_LOST
