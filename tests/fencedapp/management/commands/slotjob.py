"""``manage.py slotjob --log FILE --seconds S``: a guarded cron job with its own bounds, read
from the environment (``SLOTJOB_AT_LEAST``, ``SLOTJOB_AT_MOST``, seconds; unset: none), as a
command class would set ``lock_at_least``/``lock_at_most``. Appends one line per run to FILE."""

from __future__ import annotations

import os
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_redlock.commands import GuardedCommandMixin


def _bound(name: str) -> float | None:
    text = os.environ.get(name)
    return float(text) if text else None


class Command(GuardedCommandMixin, BaseCommand):
    help = "A cron job with lock_at_least/lock_at_most from the environment (tests)."
    lock_ttl = 10.0
    lock_at_least = _bound("SLOTJOB_AT_LEAST")
    lock_at_most = _bound("SLOTJOB_AT_MOST")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--log", required=True)
        parser.add_argument("--seconds", type=float, default=0.0)

    def handle(self, *args: Any, log: str, seconds: float, **options: Any) -> None:
        with open(log, "a") as out:
            out.write(f"{os.getpid()} {time.time():.6f}\n")
        time.sleep(seconds)
