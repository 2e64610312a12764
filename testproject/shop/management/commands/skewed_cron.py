"""``manage.py skewed_cron``: the demo's scene of the same cron line on three hosts whose clocks
differ by up to 2 s, run with and without ``at_least``.

Each "host" is a thread that fires a 0.3 s job at the start of every slot *by its own clock*:
host B's clock is 0.9 s late, host C's 1.8 s, so they fire that much later than A in real time
(as cron on those hosts would). Each fire goes through ``guard_command`` on the real masters.
Without ``at_least``, A's job has ended when B fires: the job runs up to three times per slot.
With ``at_least`` (2.5 s), A's finished lock stays held past C's fire: once per slot.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_redlock.commands import guard_command

HOSTS = {"A": 0.0, "B": 0.9, "C": 1.8}  # how late each host's clock fires, seconds
JOB_SECONDS = 0.3


class Command(BaseCommand):
    help = "Three hosts with skewed clocks run the same cron job: twice or thrice per slot "
    help += "without at_least, once with it."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--slots", type=int, default=3, help="schedule slots per run")
        parser.add_argument("--period", type=float, default=3.0, help="seconds per slot")

    def handle(self, *args: Any, slots: int, period: float, **options: Any) -> None:
        for at_least in (None, 2.5):
            title = "without at_least" if at_least is None else f"with at_least={at_least:g}s"
            self.stdout.write(f"{title}:")
            counts = self.run_slots(slots, period, at_least)
            for slot, hosts in enumerate(counts, 1):
                times = "once" if len(hosts) == 1 else f"{len(hosts)} times"
                self.stdout.write(f"  slot {slot}: ran {times} (hosts {', '.join(hosts)})")
            self.stdout.flush()

    def run_slots(self, slots: int, period: float, at_least: float | None) -> list[list[str]]:
        ran: list[list[str]] = [[] for _ in range(slots)]
        first = time.monotonic() + 0.2

        def host(name: str, late: float) -> None:
            for slot in range(slots):
                time.sleep(max(0.0, first + slot * period + late - time.monotonic()))
                try:
                    with guard_command("nightly", key="demo:skewed-cron", at_least=at_least):
                        ran[slot].append(name)
                        time.sleep(JOB_SECONDS)
                except CommandError:
                    pass  # exit 75 on that host: held by the slot's first run

        threads = [threading.Thread(target=host, args=item) for item in HOSTS.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # Let the last slot's finished lock lapse before anything else uses the key.
        last_fire = first + (slots - 1) * period
        time.sleep(max(0.0, last_fire + (at_least or 0) + 0.1 - time.monotonic()))
        return [sorted(hosts) for hosts in ran]
