"""``manage.py nightly_report``: a slow job that must not run twice at once (cron on every host).

Guarded by ``GuardedCommandMixin``: a second run while the first works exits at once with status
75 and names the holder. Try it in two terminals, or ``manage.py redlock_run -- nightly_report``
(same lock, ``command:nightly_report``: the inner guard re-enters it).
"""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count, Sum

from django_redlock.commands import GuardedCommandMixin
from testproject.shop.models import Account, Show


class Command(GuardedCommandMixin, BaseCommand):
    help = "Sum the demo's balances and tickets, slowly (runs once at a time across all hosts)."
    # A short lease, renewed while the report runs: a crashed run frees the lock within 10 s.
    lock_ttl = 10.0

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--seconds", type=float, default=5.0, help="how long the report works (default 5)"
        )

    def handle(self, *args: Any, seconds: float, **options: Any) -> None:
        self.stdout.write(f"nightly report: working for {seconds:g}s (lock command:nightly_report)")
        self.stdout.flush()
        time.sleep(seconds)
        total = Account.objects.aggregate(total=Sum("balance"))["total"] or 0
        self.stdout.write(f"  accounts: {Account.objects.count()}, total balance {total}")
        for show in Show.objects.order_by("name").annotate(sold=Count("tickets")):
            self.stdout.write(f"  {show.name}: {show.sold} of {show.seats} seats sold")
        self.stdout.write(self.style.SUCCESS("nightly report: done"))
