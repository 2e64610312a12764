"""``manage.py demo``: five local Redis masters, a fresh database, a demo admin, and runserver.

It prints the URLs (transfers, seat booking, admin, metrics), the admin login, and commands to
try in another terminal (``redlock_status``, the guarded ``nightly_report``, ``redlock_run``),
each complete: it works as pasted, with no environment to set first.

Everything stays on loopback. Ctrl-C, ``kill`` (SIGTERM) and closing the terminal (SIGHUP) all
stop it the same way: runserver and the masters stop with it. A second demo while one runs (its
port taken, or its directory in use) refuses to start and changes nothing of the first one's.
``kill -9``, which no handler sees, leaves the children running: their pids are in the demo's
directory (``children.pids``), and the next demo there stops them before it starts.
The masters run with ``appendonly yes`` and ``appendfsync always``, the setup the admin and
``redlock_status`` call healthy.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redlock.testing.masters import local_masters

#: Signals that stop the demo as Ctrl-C does: ``kill`` and a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: In the demo's directory: the pids of the processes it started, one a line.
CHILDREN = "children.pids"
#: What a leftover child's command line contains (a pid reused by another program does not).
OUR_CHILDREN = ("redis-server", "runserver")
#: Persistence that survives a crash without losing a lock (see the README's guarantees).
DURABLE = ("--appendonly", "yes", "--appendfsync", "always")


class Command(BaseCommand):
    help = "Run the demo: 5 local Redis masters + the testproject on 127.0.0.1."
    requires_system_checks: list[str] = []  # REDLOCK is filled in below, for the child server

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--masters", type=int, default=5)

    def handle(self, *args: Any, port: int, masters: int, **options: Any) -> None:
        demo_dir = Path(settings.DEMO_DIR)
        refuse_if_in_use(port, demo_dir)  # before anything of a running demo is touched
        left = stop_leftovers(demo_dir)  # a demo killed with -9 could not stop its children
        if left:
            self.stdout.write(
                f"stopped {len(left)} process(es) a killed demo left running: {', '.join(left)}"
            )
        refuse_if_port_taken(port)  # a leftover runserver may have held it
        shutil.rmtree(demo_dir, ignore_errors=True)
        demo_dir.mkdir(parents=True)
        pid_file = demo_dir / "demo.pid"
        pid_file.write_text(str(os.getpid()))
        try:
            with stop_on_signals(), local_masters(masters, demo_dir / "masters", *DURABLE) as up:
                record_children(demo_dir, [m.proc.pid for m in up if m.proc])
                self.serve(port, [m.url for m in up], demo_dir)
        except KeyboardInterrupt:
            pass  # Ctrl-C, SIGTERM or SIGHUP: everything started was stopped on the way out
        finally:
            pid_file.unlink(missing_ok=True)

    def serve(self, port: int, urls: list[str], demo_dir: Path) -> None:
        env = {**os.environ, "REDLOCK_NODES": ",".join(urls), "REDLOCK_DEMO_DIR": str(demo_dir)}
        manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
        subprocess.run([*manage, "migrate", "--verbosity", "0"], env=env, check=True)  # noqa: S603
        password = secrets.token_urlsafe(12)
        subprocess.run(  # noqa: S603
            [
                *manage,
                "shell",
                "--no-imports",
                "-c",
                "from django.contrib.auth.models import User; "
                f"User.objects.create_superuser('admin', 'admin@localhost', {password!r})",
            ],
            env=env,
            check=True,
        )
        self.introduce(port, password, urls, env)
        server = subprocess.Popen(  # noqa: S603
            [*manage, "runserver", "--noreload", f"127.0.0.1:{port}"], env=env
        )
        record_children(demo_dir, [server.pid])
        try:
            server.wait()
        finally:
            stop(server)

    def introduce(self, port: int, password: str, urls: list[str], env: dict[str, str]) -> None:
        base = f"http://127.0.0.1:{port}"
        # Each command carries its environment and absolute paths: it works pasted anywhere.
        prefix = " ".join(
            f"{name}={shlex.quote(env[name])}" for name in ("REDLOCK_NODES", "REDLOCK_DEMO_DIR")
        )
        run = f"{prefix} {shlex.quote(sys.executable)} "
        run += shlex.quote(str(Path(settings.BASE_DIR) / "manage.py"))
        say = self.stdout.write
        say(self.style.SUCCESS("django-redlock demo"))
        say(f"  masters : {', '.join(urls)}")
        say(f"  demo    : {base}/  (money transfers under redlock())")
        say(f"  seats   : {base}/seats/  (seat bookings under @lock_view)")
        say(f"  admin   : {base}/admin/  (user admin, password {password})")
        say(f"  metrics : {base}/metrics/")
        say("  In another terminal (each line works as pasted):")
        say(f"  status  : {run} redlock_status")
        say(
            f"  guarded : {run} nightly_report\n"
            f"            (run it in two terminals at once: the second exits with status 75, "
            f"'held by another process')"
        )
        say(f"  any cmd : {run} redlock_run -- clearsessions\n            (as a cron line would)")
        say(
            f"  skew    : {run} skewed_cron\n"
            f"            (three hosts, clocks up to 2 s apart: a job runs up to thrice per slot "
            f"without at_least, once with it)"
        )
        say("  Ctrl-C (or kill, or closing this terminal) stops the site and the masters.\n")
        self.stdout.flush()


def refuse_if_in_use(port: int, demo_dir: Path) -> None:
    """``CommandError`` (exit status 1) if the port is taken or a live demo owns ``demo_dir``."""
    pid_file = demo_dir / "demo.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        if pid != os.getpid() and _alive(pid):
            raise CommandError(
                f"a demo (pid {pid}) is running from {demo_dir}: stop it first (nothing changed)"
            )
    if not (demo_dir / CHILDREN).exists():  # else the port may be a leftover's: cleaned first
        refuse_if_port_taken(port)


def refuse_if_port_taken(port: int) -> None:
    with socket.socket() as probe:
        # As runserver binds: a port whose last connections linger in TIME-WAIT is free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            raise CommandError(
                f"port {port} is taken ({exc.strerror}): another demo or server runs there; "
                f"stop it or pass --port (nothing changed)"
            ) from None


def record_children(demo_dir: Path, pids: list[int]) -> None:
    """Note the processes this demo started, so that a next demo can stop them if this one is
    killed with SIGKILL (which no handler sees)."""
    with (demo_dir / CHILDREN).open("a") as out:
        out.writelines(f"{pid}\n" for pid in pids)


def stop_leftovers(demo_dir: Path) -> list[str]:
    """SIGKILL what a dead demo in ``demo_dir`` left running (its redis-servers, its runserver);
    a pid now reused by another program is left alone. Returns what was stopped."""
    try:
        pids = [int(line) for line in (demo_dir / CHILDREN).read_text().split()]
    except (OSError, ValueError):
        return []
    stopped = []
    for pid in pids:
        command = _command_line(pid)
        if command and any(ours in command for ours in OUR_CHILDREN):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                stopped.append(f"{Path(command.split()[0]).name} (pid {pid})")
                _wait_gone(pid)
    (demo_dir / CHILDREN).unlink(missing_ok=True)
    return stopped


def _command_line(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def _wait_gone(pid: int, timeout: float = 5.0) -> None:
    """Until ``pid`` has exited (it is not our child: poll, do not wait)."""
    deadline = time.monotonic() + timeout
    while _alive(pid) and "zombie" not in _state(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _state(pid: int) -> str:
    try:
        return "zombie" if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z" else ""
    except (OSError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does, so that every ``with`` and
    ``finally`` on the way out stops what it started; the old handlers come back after."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop(server: subprocess.Popen[bytes]) -> None:
    """Stop runserver: SIGTERM, then SIGKILL if it has not gone within 10 s."""
    if server.poll() is None:
        server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
