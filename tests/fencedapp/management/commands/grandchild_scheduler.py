"""``manage.py grandchild_scheduler --log FILE``: a led command that starts its scheduler as a
subprocess (as a wrapper around ``celery beat`` would) and waits for it. The grandchild appends
``<pid> <unix time>`` to FILE at every tick: the tests read when each one worked.

``--ignore-term``: the command and its grandchild ignore SIGTERM (only SIGKILL stops them).
``--setsid``: the grandchild leaves the command's process group and session (a daemon would).
``--exit-after S``: the command exits after S seconds, leaving its grandchild running."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

TICKER = """
import os, signal, sys, time
if sys.argv[3] == "1":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    with open(sys.argv[1], "a") as out:
        out.write(f"{os.getpid()} {time.time():.6f}\\n")
    time.sleep(float(sys.argv[2]))
"""


class Command(BaseCommand):
    help = "Start a ticking scheduler as a subprocess and wait for it (tests of redlock_run)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--log", required=True)
        parser.add_argument("--every", type=float, default=0.02)
        parser.add_argument("--ignore-term", action="store_true")
        parser.add_argument("--setsid", action="store_true")
        parser.add_argument("--exit-after", type=float, default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["ignore_term"]:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ignore = "1" if options["ignore_term"] else "0"
        ticker = subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", TICKER, options["log"], str(options["every"]), ignore],
            start_new_session=options["setsid"],
        )
        if options["exit_after"] is not None:
            time.sleep(options["exit_after"])
            return
        ticker.wait()
