"""One leader across hosts: ``leader(name)`` for Python code, and ``run_as_leader`` behind
``manage.py redlock_run --leader -- <command>`` (e.g. a scheduler that must run on one host only).

Every host runs the same thing; one holds the lock ``leader:<name>`` (auto-extended) and works,
the others are standbys queued on the engine's waiters: they sleep on release notices and on
the holder's remaining lease, not in a polling loop. When the leader exits, its release wakes the
first standby at once; when it dies (``kill -9``), its lease lapses within its TTL, and a standby
takes over then.

A leader must stop working *before* its validity ends, not after: then no two leaders overlap
even if the masters are cut off from it (a partition, a long pause of the renewal). Both forms
watch the lease's validity on the monotonic clock (no I/O): renewals happen at a third of the
TTL, so a validity down to ``STEP_DOWN`` of the TTL means renewal has failed for a while. Then
``leader()`` sets ``lost`` and calls ``on_step_down``; ``run_as_leader`` sends the command
SIGTERM, and SIGKILL once validity is down to ``KILL`` of the TTL, and waits for it to be gone.

The command runs under a keeper (``supervise.py``), in a process group of its own: the
step-down's SIGTERM, the SIGKILL and the signals forwarded to the leader reach everything the
command started, not only the command (a wrapper that starts ``celery beat`` as a subprocess).
The keeper gets a signal when the leader dies (Linux ``PR_SET_PDEATHSIG``) and kills every
descendant of the command then, even one that left the group (it is their subreaper): a leader
killed with ``kill -9`` leaves no orphan working on. It does the same when the command exits
by itself: the lock is released only once nothing it started runs any more. A keeper killed
itself leaves that to the leader, which SIGKILLs the command's group (the keeper told it). A
leader paused past its validity (SIGSTOP) cannot stop its command: the keeper holds the
deadline the leader sends at every renewal, and kills the command's processes at it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType

from . import redlock
from .contrib import prometheus
from .engine import Lock, LockContended, LockLost, QuorumUnavailable
from .engine.leases.leases import Lease, current_owner
from .keys import bounded_resource
from .supervise import KILL_ALL

#: The keeper the led command runs under (run as a script: see its docstring).
KEEPER = Path(__file__).resolve().parent / "supervise.py"

__all__ = ["KILL", "STEP_DOWN", "Leadership", "leader", "run_as_leader"]

#: Step down (``on_step_down``; SIGTERM to a command) when validity is down to this part of
#: the TTL: renewal is due at a third of it, so this means renewals have failed for a third.
STEP_DOWN = 1 / 3
#: SIGKILL the command when validity is down to this part of the TTL.
KILL = 1 / 6
#: A standby's wait for one turn: it waits again after it (a wait has a bound; this one is
#: only how often a standby says it is still there).
STANDBY_WAIT = 3600.0


def leader_resource(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"leader name must be a non-empty str, got {name!r}")
    return bounded_resource(f"leader:{name}")


class Leadership:
    """What ``leader()`` yields: the lock, and ``lost`` (set once this process must stop
    leading: its renewal failed for a third of the TTL, or the masters no longer hold it)."""

    def __init__(self, lock: Lock, lease: Lease) -> None:
        self.lock = lock
        self.lease = lease
        self.lost = threading.Event()

    @property
    def validity(self) -> float:
        """Seconds of guaranteed leadership left (any thread may ask)."""
        return 0.0 if self.lease.lost else self.lease.validity


def become_leader(
    name: str, *, ttl: float | None = None, label: str | None = None
) -> tuple[Lock, Leadership]:
    """Wait, as a standby, until this process leads ``name``; the held lock (auto-extended)."""
    resource = leader_resource(name)
    while True:
        lock = redlock(
            resource,
            ttl=ttl,
            wait=STANDBY_WAIT,
            label=label or f"leader {name}",
            auto_extend=True,
        )
        from .conf import get_redlock

        holders = get_redlock().holders
        try:
            lock.acquire()
        except LockContended:
            if any(holders.of(current_owner(), lock.keys) or ()):
                raise  # refused at once: this thread/task leads already, it would wait for itself
            continue  # still led elsewhere: queue again
        except QuorumUnavailable:
            time.sleep(min(lock.ttl / 3, 1.0))  # the masters are down: not a reason to exit
            continue
        return lock, Leadership(lock, holders[lock.key])


@contextlib.contextmanager
def leader(
    name: str,
    *,
    ttl: float | None = None,
    label: str | None = None,
    on_step_down: Callable[[Leadership], None] | None = None,
) -> Iterator[Leadership]:
    """Block until this process leads ``name`` (standbys wait queued), then run the block as
    the leader. Watch ``leadership.lost`` (or pass ``on_step_down``, called once, from a
    watcher thread) and stop leading work when it is set: that happens while some validity is
    left (``STEP_DOWN``), so the next leader cannot start before this one stopped. Leaving
    the block releases the lock (a standby takes over at once)."""
    lock, leadership = become_leader(name, ttl=ttl, label=label)
    done = threading.Event()
    threshold = lock.ttl * STEP_DOWN

    def watch() -> None:
        while not done.wait(_poll(lock.ttl)):
            if leadership.validity <= threshold:
                leadership.lost.set()
                if on_step_down is not None:
                    on_step_down(leadership)
                return

    watcher = threading.Thread(target=watch, name=f"redlock-leader-{name}", daemon=True)
    watcher.start()
    began = time.monotonic()
    try:
        with contextlib.ExitStack() as held:
            held.push(lock)
            yield leadership
    except LockLost:
        prometheus.job(f"leader:{name}", "lost", time.monotonic() - began)
        raise
    else:
        outcome = "lost" if leadership.lost.is_set() else "ran"
        prometheus.job(f"leader:{name}", outcome, time.monotonic() - began)
    finally:
        done.set()
        watcher.join()


def run_as_leader(
    name: str,
    argv: Sequence[str],
    *,
    ttl: float | None = None,
    label: str | None = None,
    env: dict[str, str] | None = None,
    stderr: Callable[[str], None] = lambda text: print(text, file=sys.stderr, flush=True),
) -> int:
    """Wait to lead ``name``, then run ``argv`` as a child process while leading. Returns its
    exit status; or raises ``LockLost`` after stopping it (SIGTERM, then SIGKILL before
    validity ends) if leadership was lost."""
    lock, leadership = become_leader(name, ttl=ttl, label=label)
    began = time.monotonic()
    term_at, kill_at = lock.ttl * STEP_DOWN, lock.ttl * KILL
    # Its own session: a terminal's Ctrl-C reaches the command once, through us (``forward``).
    report, reported = os.pipe()  # the keeper writes the command's process group there
    told, tell = os.pipe()  # we write our deadlines there (see ``supervise``)
    os.set_blocking(tell, False)  # (a keeper that stopped reading never blocks the leader)
    keeper = [sys.executable, str(KEEPER), str(os.getpid()), str(reported), str(told), *argv]
    try:
        child = subprocess.Popen(  # noqa: S603
            keeper, env=env, start_new_session=True, pass_fds=(reported, told)
        )
    finally:
        os.close(reported)
        os.close(told)
    deadline = 0.0

    def forward(signum: int, frame: FrameType | None) -> None:
        # Stopping us stops the command (the keeper passes it on to its group): we are its only
        # leader.
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = _handle((signal.SIGTERM, signal.SIGINT), forward)
    stepped_down_at: float | None = None
    try:
        while child.poll() is None:
            validity = leadership.validity
            # The keeper kills the command itself at this deadline if we do not move it on: a
            # leader paused meanwhile (SIGSTOP) could not (the same margin as ``kill_at``).
            if stepped_down_at is None and leadership.lease.valid_until - kill_at != deadline:
                deadline = leadership.lease.valid_until - kill_at
                with contextlib.suppress(OSError):  # (a keeper gone, or a full pipe)
                    os.write(tell, f"{deadline!r}\n".encode())
            if validity <= term_at and stepped_down_at is None:
                stepped_down_at = validity
                leadership.lost.set()
                stderr(
                    f"WARNING: leader {name}: leadership is running out ({validity:.2f}s of "
                    f"validity left, renewal failing): stopping the command (SIGTERM)"
                )
                child.terminate()
            if validity <= kill_at:
                _kill(child)
                break
            time.sleep(_poll(lock.ttl))
    finally:
        _restore(previous)
        if child.poll() is None:  # interrupted while waiting: never leave it working
            _kill(child)
        _kill_group_of(report)
        os.close(tell)
    lost = stepped_down_at is not None
    try:
        lock.release()
    except LockLost as error:
        lost = lost or not error.unconfirmed  # unconfirmed: it led within its lease to the end
    held = time.monotonic() - began
    if lost:
        prometheus.job(f"leader:{name}", "lost", held)
        how = (
            "it ran to its end"
            if stepped_down_at is None
            else f"the command was stopped with {stepped_down_at:.2f}s of validity left"
        )
        raise LockLost(lock.resource, f"leader {name}: leadership lost after {held:.1f}s; {how}")
    prometheus.job(f"leader:{name}", "ran", held)
    return child.returncode


def _poll(ttl: float) -> float:
    """How often the validity is looked at: often enough that the kill lands well before the
    end (at most a tenth of the ``KILL`` margin), and no more often than 200 times a second."""
    return max(0.005, min(0.05, ttl * KILL / 10))


def _kill(keeper: subprocess.Popen[bytes]) -> None:
    """Have the keeper SIGKILL everything the command started, and wait until it has (it exits
    once every descendant is reaped). A keeper that does not answer in time is killed itself:
    the command then dies with it (its own death signal)."""
    with contextlib.suppress(ProcessLookupError):
        keeper.send_signal(KILL_ALL)
    try:
        keeper.wait(timeout=KEEPER_PATIENCE)
    except subprocess.TimeoutExpired:
        keeper.kill()
        keeper.wait()


def _kill_group_of(report: int) -> None:
    """The keeper is gone: SIGKILL the command's process group, which it reported (``report``,
    closed here). Nothing is left there when the keeper ended as it should; a keeper killed
    itself (SIGKILL, the OOM killer) left the command's descendants running."""
    try:
        group = int(os.read(report, 32) or b"0")
    finally:
        os.close(report)
    if group > 0:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


#: How long the keeper may take to kill and reap the command's processes (it takes
#: milliseconds; this is for a keeper itself stopped or starved).
KEEPER_PATIENCE = 5.0


def _handle(
    signums: Sequence[signal.Signals], handler: Callable[[int, FrameType | None], None]
) -> dict[signal.Signals, object]:
    if threading.current_thread() is not threading.main_thread():
        return {}  # only the main thread may set handlers; elsewhere the caller's own stand
    return {s: signal.signal(s, handler) for s in signums}


def _restore(previous: dict[signal.Signals, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]
