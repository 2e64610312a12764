"""``manage.py redlock_run [--key K] [--wait S] [--ttl T] [--limit N] [--at-least S] [--at-most S]
[--leader] -- <command> [args...]``

Runs any installed management command under a Redlock, as a cron line would use it on every host::

    */5 * * * * cd /srv/app && ./manage.py redlock_run -- clearsessions

Exit status: the command's own; 75 (held elsewhere: not started), 69 (no quorum of masters: not
started), 70 (the lock was lost while the command ran; it ran to its end). ``--limit N`` lets up
to N runs go at once (a semaphore's permits; 75 when all N are taken). See
``django_redlock.commands`` for why.

``--leader``: the one leader across hosts (``django_redlock.leadership``): every host runs the same
line, one runs the command, the others wait queued and take over when it exits or dies; a leader
that loses its lease stops the command before its validity ends and exits 70 (run it under a
supervisor that starts it again, as a standby).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...commands import EXIT_LOST, guard_command
from ...conf import get_redlock
from ...engine import LockLost
from ...engine.base import protocol
from ...engine.scripts.permits import check_limit
from ...leadership import run_as_leader


def _seconds(name: str, allow_zero: bool) -> Any:
    def parse(text: str) -> float:
        try:
            return protocol.check_seconds(name, float(text), allow_zero=allow_zero)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _at_most(text: str) -> float:
    at_most = _seconds("--at-most", allow_zero=False)(text)
    try:
        protocol.check_hold_bounds(None, at_most)  # (it caps the lease: at least the shortest)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--{str(exc).replace('_', '-')}") from None
    return float(at_most)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return "unknown"


def _key(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("--key must not be empty: leave it out for the default")
    return text


def _limit(text: str) -> int:
    try:
        return check_limit(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--limit: {exc}") from None


class Command(BaseCommand):
    help = (
        "Run another management command while holding a Redlock (default key "
        "'command:<name>'), renewed while it runs. Usage: redlock_run [--key K] [--wait S] "
        "[--ttl T] [--limit N] -- <command> [args...]"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--key", type=_key, help="lock resource name (default: command:<command>)"
        )
        parser.add_argument(
            "--wait",
            type=_seconds("--wait", allow_zero=True),
            default=None,
            help="seconds to wait for the lock when held elsewhere (default 0: give up at once; "
            "not with --leader, whose standbys wait until they lead)",
        )
        parser.add_argument(
            "--ttl",
            type=_seconds("--ttl", allow_zero=False),
            default=None,
            help="lease in seconds, renewed while the command runs (default REDLOCK['TTL'])",
        )
        parser.add_argument(
            "--limit",
            type=_limit,
            default=None,
            help="let up to N runs go at once (a semaphore of N permits; default: one run)",
        )
        parser.add_argument(
            "--at-least",
            dest="at_least",
            type=_seconds("--at-least", allow_zero=False),
            default=None,
            help="keep the lock (unrenewed) until this many seconds after it was taken, even if "
            "the command ends sooner: a copy on a host whose clock is late skips",
        )
        parser.add_argument(
            "--at-most",
            dest="at_most",
            type=_at_most,
            default=None,
            help="stop renewing the lock after this many seconds: a hung command frees it, and "
            "the run exits 70",
        )
        parser.add_argument(
            "--leader",
            action="store_true",
            help="run the command as the one leader across hosts: wait as a standby until the "
            "lock is free, then run it (in a child process) while holding it; stop it before "
            "the lock's validity ends if leadership is lost (exit 70)",
        )
        parser.add_argument("command_name", metavar="command", help="the command to run")
        parser.add_argument(
            "command_args", metavar="args", nargs=argparse.REMAINDER, help="its arguments"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name: str = options["command_name"]
        if options["at_least"] is not None and options["at_most"] is not None:
            if options["at_least"] > options["at_most"]:
                raise CommandError(
                    f"--at-least ({options['at_least']:g}) must not exceed --at-most "
                    f"({options['at_most']:g})",
                    returncode=2,
                )
        bounded = options["at_least"] is not None or options["at_most"] is not None
        if options["limit"] is not None and (bounded or options["leader"]):
            raise CommandError(
                "--limit takes no --at-least/--at-most/--leader: they keep, cut or lead one "
                "holder's lock",
                returncode=2,
            )
        command_args: list[str] = list(options["command_args"])
        if command_args[:1] == ["--"]:
            command_args = command_args[1:]
        commands = get_commands()
        if name not in commands:
            raise CommandError(f"unknown command {name!r}: not installed (see manage.py help)")
        if name == "redlock_run":
            raise CommandError("redlock_run cannot guard itself: name the command to run")
        self._check_ttl(options["ttl"])
        if options["leader"]:
            if bounded:
                raise CommandError("--leader takes no --at-least/--at-most", returncode=2)
            if options["wait"] is not None:
                raise CommandError(
                    "--leader takes no --wait: a standby waits until it leads (give the leader "
                    "a key of its own with --key to run a second one)",
                    returncode=2,
                )
            self._lead(name, command_args, options)
            return
        command = load_command_class(commands[name], name)
        # The inner command writes where we write (call_command's stdout=, or the terminal).
        streams = {k: options[k] for k in ("stdout", "stderr") if options.get(k) is not None}
        with guard_command(
            name,
            key=options["key"],
            ttl=options["ttl"],
            wait=options["wait"] or 0.0,
            label=f"manage.py redlock_run -- {name}",
            stderr=options.get("stderr"),
            at_least=options["at_least"],
            at_most=options["at_most"],
            limit=options["limit"],
        ):
            call_command(command, *command_args, **streams)

    def _check_ttl(self, ttl: float | None) -> None:
        """``--ttl`` as the settings check would take ``REDLOCK['TTL']`` (within ``MAX_TTL``,
        long next to ``NODE_TIMEOUT``), before any lock is made: a lease that one slow master's
        answer would eat is lost as soon as it is taken (under ``--leader``, at once)."""
        if ttl is None:
            return
        try:
            engine = get_redlock()
        except ImproperlyConfigured:
            return  # the guard says what the settings check says, as without --ttl
        try:
            engine.check_ttl(ttl)
            protocol.check_node_timeout(
                engine.node_timeout, ttl, names=("REDLOCK['NODE_TIMEOUT']", "--ttl")
            )
        except ValueError as exc:
            raise CommandError(f"--ttl: {exc}", returncode=2) from None

    def _lead(self, name: str, command_args: list[str], options: dict[str, Any]) -> None:
        # The command runs in a child process, so that a leader that loses its lease can stop
        # it (SIGTERM, then SIGKILL) before its validity ends: code in this process could not be.
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
            "PYTHONPATH": os.pathsep.join(
                p for p in [sys.path[0], os.environ.get("PYTHONPATH", "")] if p
            ),
        }
        argv = [sys.executable, "-m", "django", name, *command_args]
        leader_name = options["key"] or name
        err = self.stderr
        try:
            returncode = run_as_leader(
                leader_name,
                argv,
                ttl=options["ttl"],
                label=f"manage.py redlock_run --leader -- {name}",
                env=env,
                stderr=lambda text: err.write(text),
            )
        except LockLost as error:
            raise CommandError(str(error), returncode=EXIT_LOST) from error
        if returncode < 0:
            # Killed by a signal: exit as a shell does for it (128 + the signal: 137 for
            # SIGKILL, 143 for SIGTERM), as plain redlock_run's own death shows; not
            # sys.exit(-9), which a shell reads as 247.
            signum = -returncode
            raise CommandError(
                f"{name} was killed by signal {signum} ({_signal_name(signum)})",
                returncode=128 + signum,
            )
        if returncode != 0:
            raise CommandError(f"{name} exited with status {returncode}", returncode=returncode)
