"""``manage.py demo``: five local Redis masters, a fresh database, a demo admin, and runserver.

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

from django_redlock.localmasters import local_masters


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
                    "-c",
                    "from django.contrib.auth.models import User; "
                    f"User.objects.create_superuser('admin', 'admin@localhost', {password!r})",
                ],
                env=env,
                check=True,
            )
            base = f"http://127.0.0.1:{port}"
            self.stdout.write(self.style.SUCCESS("django-redlock demo"))
            self.stdout.write(f"  masters : {', '.join(m.url for m in started)}")
            self.stdout.write(f"  demo    : {base}/")
            self.stdout.write(f"  admin   : {base}/admin/  (user admin, password {password})")
            self.stdout.write(
                f"  status  : REDLOCK_NODES={env['REDLOCK_NODES']} "
                f"{sys.executable} manage.py redlock_status"
            )
            self.stdout.write("  Ctrl-C stops the site and the masters.\n")
            self.stdout.flush()
            try:
                subprocess.run(  # noqa: S603
                    [*manage, "runserver", "--noreload", f"127.0.0.1:{port}"], env=env, check=False
                )
            except KeyboardInterrupt:
                pass
