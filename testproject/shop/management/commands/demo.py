"""``manage.py demo``: five local Redis masters, a fresh database, a demo admin, and runserver.

It prints the URLs (transfers, seat booking, admin, metrics), the admin login, and the commands
to try by hand: ``redlock_status``, the guarded ``nightly_report`` and ``redlock_run``.

Everything stays on loopback. Stop it with Ctrl-C: the masters stop with it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from django_redlock.testing.masters import local_masters


class Command(BaseCommand):
    help = "Run the demo: 5 local Redis masters + the testproject on 127.0.0.1."
    requires_system_checks: list[str] = []  # REDLOCK is filled in below, for the child server

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--masters", type=int, default=5)

    def handle(self, *args: Any, port: int, masters: int, **options: Any) -> None:
        demo_dir = Path(settings.DEMO_DIR)
        shutil.rmtree(demo_dir, ignore_errors=True)
        demo_dir.mkdir(parents=True)
        password = secrets.token_urlsafe(12)
        with local_masters(masters, demo_dir / "masters") as started:
            env = {
                **os.environ,
                "REDLOCK_NODES": ",".join(m.url for m in started),
                "REDLOCK_DEMO_DIR": str(demo_dir),
            }
            manage = [sys.executable, str(Path(settings.BASE_DIR) / "manage.py")]
            subprocess.run([*manage, "migrate", "--verbosity", "0"], env=env, check=True)  # noqa: S603
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
            base = f"http://127.0.0.1:{port}"
            shell_env = f"REDLOCK_NODES={env['REDLOCK_NODES']}"
            if "REDLOCK_DEMO_DIR" in os.environ:
                shell_env += f" REDLOCK_DEMO_DIR={demo_dir}"
            run = f"{sys.executable} manage.py"
            self.stdout.write(self.style.SUCCESS("django-redlock demo"))
            self.stdout.write(f"  masters : {', '.join(m.url for m in started)}")
            self.stdout.write(f"  demo    : {base}/  (money transfers under redlock())")
            self.stdout.write(f"  seats   : {base}/seats/  (seat bookings under @lock_view)")
            self.stdout.write(f"  admin   : {base}/admin/  (user admin, password {password})")
            self.stdout.write(f"  metrics : {base}/metrics/")
            self.stdout.write(f"  In another terminal, in {Path.cwd()}:")
            self.stdout.write(f"  env     : export {shell_env}")
            self.stdout.write(f"  status  : {run} redlock_status")
            self.stdout.write(
                f"  guarded : {run} nightly_report  (a guarded command: run it in two terminals "
                f"at once, the second exits with status 75, 'held by another process')"
            )
            self.stdout.write(
                f"  any cmd : {run} redlock_run -- clearsessions  (guards any installed command, "
                f"as a cron line would)"
            )
            self.stdout.write("  Ctrl-C stops the site and the masters.\n")
            self.stdout.flush()
            try:
                subprocess.run(  # noqa: S603
                    [*manage, "runserver", "--noreload", f"127.0.0.1:{port}"], env=env, check=False
                )
            except KeyboardInterrupt:
                pass
