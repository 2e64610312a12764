"""The led command's keeper: ``python supervise.py <leader pid> <fd> <fd> <argv...>``, started by
``leadership.run_as_leader`` between the leader and the command, so that nothing the command
started outlives the leader's lease.

Why a process of its own: ``PR_SET_PDEATHSIG`` reaches only a process's direct child, and a
leader killed with ``kill -9`` runs no code. A command that starts its scheduler as a subprocess
(a wrapper around ``celery beat``) would keep that grandchild ticking while a standby starts its
own. This keeper gets its signal when the leader dies (``PR_SET_PDEATHSIG``, ``SIGUSR1``) and
then kills everything the command started, at once:

- the command runs in a process group of its own; the group is what a signal reaches
  (forwarded ``SIGTERM``/``SIGINT``, the step-down's ``SIGTERM``, the kill);
- the keeper is a subreaper (``PR_SET_CHILD_SUBREAPER``): a descendant that left the group
  (``setsid``, a daemon's double fork) becomes the keeper's child once its parent is gone, and
  is killed too. Every descendant is reaped before the keeper exits: when it has exited, none
  of them runs any more.

The keeper writes the command's process group to the first ``fd`` (a pipe to the leader): a
keeper that is killed itself (SIGKILL, the OOM killer) cannot take the group down, and the
leader then does. From the second, it reads until when the leader may let the command work (its
lease's validity, less the margin at which the leader itself would kill it): a leader paused
past that (SIGSTOP, Ctrl-Z in its terminal, a frozen VM) can stop nothing, so the keeper kills
everything then, as if the leader had asked.

Signals from the leader: ``SIGTERM``/``SIGINT``: passed on to the command's group; ``SIGUSR1``
(also its death signal): kill every descendant now, and exit. When the command exits by itself,
whatever it left running is killed too (its leader is about to release the lock). The keeper
exits as the command did: its status, or the same signal.

Runs as a script (no import of Django or of the package: it starts in ~20 ms), Linux only for the
death signal and the subreaper (elsewhere they are skipped: the group still stops on signals).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType

__all__ = ["KILL_ALL", "main"]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
#: What the leader sends (and what the keeper gets when the leader dies): kill everything now.
KILL_ALL = signal.SIGUSR1
#: Passed on to the command's group.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _KillAll(Exception):
    """Raised in the main thread by ``KILL_ALL``'s handler."""


def _prctl(option: int, value: int) -> bool:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(option, value, 0, 0, 0) == 0)
    return False


def _children() -> list[int]:
    """This process's children now (Linux ``/proc``; empty where unreadable)."""
    pids: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{os.getpid()}/task").iterdir():
            with contextlib.suppress(OSError):
                pids += [int(p) for p in (task / "children").read_text().split()]
    return pids


def kill_all(group: int | None) -> None:
    """SIGKILL the command's group and every descendant that became our child, until none is
    left, each reaped: none of them runs any more when this returns."""
    signal.signal(KILL_ALL, signal.SIG_IGN)  # (asked twice: once is under way)
    while True:
        if group is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        for pid in _children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.waitpid(-1, 0)  # one gone; loop: its children are ours now (subreaper)
        except ChildProcessError:
            return


def _exit_as(returncode: int) -> None:
    """Exit as the command did: its status, or killed by the same signal."""
    if returncode >= 0:
        os._exit(returncode)
    signum = -returncode
    with contextlib.suppress(OSError, ValueError):  # (SIGKILL's cannot be set: it is default)
        signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal that does not end a process by default


def _hold_to(deadlines: int) -> None:
    """Read the leader's deadlines (monotonic seconds, one a line: the clock is the host's,
    shared by every process); once the last one passes with no new one, ``KILL_ALL``. A leader
    that is paused (SIGSTOP, Ctrl-Z, a frozen VM) sends none, and may have lost its lease
    meanwhile: its command must not work on. The pipe's end (the leader is gone, or done)
    ends the watch: the death signal does the rest."""
    deadline: float | None = None
    pending = b""
    while True:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([deadlines], [], [], timeout)
        if not ready:
            os.kill(os.getpid(), KILL_ALL)  # (handled in the main thread)
            return
        data = os.read(deadlines, 4096)
        if not data:
            return
        *lines, pending = (pending + data).split(b"\n")
        if lines:
            deadline = float(lines[-1])


def main(argv: list[str]) -> None:
    # The leader's pid; where to write the command's group; where the leader's deadlines come.
    leader, report, deadlines = int(argv[0]), int(argv[1]), int(argv[2])
    command = argv[3:]

    def kill_now(signum: int, frame: FrameType | None) -> None:
        raise _KillAll

    signal.signal(KILL_ALL, kill_now)
    _prctl(PR_SET_PDEATHSIG, KILL_ALL)
    if os.getppid() != leader:
        os._exit(128 + signal.SIGKILL)  # the leader died before we could watch it: run nothing
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    threading.Thread(target=_hold_to, args=(deadlines,), daemon=True).start()
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, frame: FrameType | None) -> None:
        if child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        # Its own group (pgid = its pid); it also dies with us if we are killed (belt and braces:
        # a keeper killed with SIGKILL cannot take the group down).
        child = subprocess.Popen(command, process_group=0, preexec_fn=_die_with_parent)  # noqa: S603, PLW1509
        os.write(report, f"{child.pid}\n".encode())  # the leader kills the group if we die
        os.close(report)
        returncode = child.wait()
        kill_all(child.pid)  # what it left running: its leader is about to let the lock go
    except _KillAll:
        kill_all(None if child is None else child.pid)
        os._exit(128 + signal.SIGKILL)
    _exit_as(returncode)


def _die_with_parent() -> None:
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    main(sys.argv[1:])
