"""``manage.py redlock_run [--key K] [--wait S] [--ttl T] [--limit N] -- <command> [args...]``

Runs any installed management command under a Redlock, as a cron line would use it on every host::

    */5 * * * * cd /srv/app && ./manage.py redlock_run -- clearsessions

Exit status: the command's own; 75 (held elsewhere: not started), 69 (no quorum of masters: not
started), 70 (the lock was lost while the command ran; it ran to its end). ``--limit N`` lets up
to N runs go at once (a semaphore's permits; 75 when all N are taken). See
``django_redlock.commands`` for why.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...commands import guard_command
from ...engine import protocol
from ...engine.permit_scripts import check_limit


def _seconds(name: str, allow_zero: bool) -> Any:
    def parse(text: str) -> float:
        try:
            return protocol.check_seconds(name, float(text), allow_zero=allow_zero)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


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
        parser.add_argument("--key", help="lock resource name (default: command:<command>)")
        parser.add_argument(
            "--wait",
            type=_seconds("--wait", allow_zero=True),
            default=0.0,
            help="seconds to wait for the lock when held elsewhere (default 0: give up at once)",
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
        parser.add_argument("command_name", metavar="command", help="the command to run")
        parser.add_argument(
            "command_args", metavar="args", nargs=argparse.REMAINDER, help="its arguments"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name: str = options["command_name"]
        command_args: list[str] = list(options["command_args"])
        if command_args[:1] == ["--"]:
            command_args = command_args[1:]
        commands = get_commands()
        if name not in commands:
            raise CommandError(f"unknown command {name!r}: not installed (see manage.py help)")
        if name == "redlock_run":
            raise CommandError("redlock_run cannot guard itself: name the command to run")
        command = load_command_class(commands[name], name)
        # The inner command writes where we write (call_command's stdout=, or the terminal).
        streams = {k: options[k] for k in ("stdout", "stderr") if options.get(k) is not None}
        with guard_command(
            name,
            key=options["key"],
            ttl=options["ttl"],
            wait=options["wait"],
            label=f"manage.py redlock_run -- {name}",
            stderr=options.get("stderr"),
            limit=options["limit"],
        ):
            call_command(command, *command_args, **streams)
