"""``manage.py scheduler``: the demo's stand-in for a scheduler that must run on one host only
(celery beat, a cron daemon). Run it on every host as ``manage.py redlock_run --leader --
scheduler``: one ticks, the others wait and take over when it stops.

Each tick prints ``tick <n> from pid <pid>`` and, with ``--log FILE``, appends ``<pid> <unix
time>`` to FILE (the tests read when each leader worked, to check that no two overlapped).
"""

from __future__ import annotations

import os
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = (
        "Tick forever (or --ticks times), as a scheduler would: run it with redlock_run --leader."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--every", type=float, default=1.0, help="seconds between ticks")
        parser.add_argument("--ticks", type=int, default=0, help="stop after this many (0: never)")
        parser.add_argument("--log", default=None, help="append '<pid> <unix time>' per tick")

    def handle(self, *args: Any, every: float, ticks: int, log: str | None, **options: Any) -> None:
        n = 0
        while not ticks or n < ticks:
            n += 1
            if log:
                with open(log, "a") as out:
                    out.write(f"{os.getpid()} {time.time():.6f}\n")
            self.stdout.write(f"tick {n} from pid {os.getpid()}")
            self.stdout.flush()
            time.sleep(every)
