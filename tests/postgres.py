"""A throwaway PostgreSQL cluster on a free loopback port, for the tests that must run on
PostgreSQL too (Debian's ``postgresql`` package: ``/usr/lib/postgresql/*/bin``).

Under root, the cluster runs as the ``postgres`` user (PostgreSQL refuses to run as root) in a
temporary directory handed to that user. Without the binaries, the tests skip saying why, except
under ``CI=true`` or ``REDLOCK_REQUIRE_POSTGRES=1`` (``.ci/run`` installs the package), where
they fail.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from django_redlock.testing.masters import free_port


def postgres_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def required() -> bool:
    return os.environ.get("CI") == "true" or os.environ.get("REDLOCK_REQUIRE_POSTGRES") == "1"


@contextlib.contextmanager
def throwaway_postgres() -> Iterator[int]:
    """Start a cluster (trust authentication, user ``postgres``, no fsync); yield its port."""
    bin_dir = postgres_bin()
    if bin_dir is None:
        why = "PostgreSQL binaries not found (/usr/lib/postgresql/*/bin; apt install postgresql)"
        if required():
            pytest.fail(f"{why}; required here (CI=true or REDLOCK_REQUIRE_POSTGRES=1)")
        pytest.skip(why)
    run_as: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="redlock-pg-"))
    if os.geteuid() == 0:  # PostgreSQL will not run as root
        user = pwd.getpwnam("postgres")
        os.chown(base, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data, log = base / "data", base / "log"
    port = free_port()
    options = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"

    def pg(*command: str) -> None:
        subprocess.run(  # noqa: S603
            [*run_as, *command], check=True, capture_output=True, text=True, timeout=60
        )

    try:
        pg(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-N")
        pg(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "start")
    except subprocess.CalledProcessError as error:
        shutil.rmtree(base, ignore_errors=True)
        raise AssertionError(f"could not start PostgreSQL: {error.stderr}") from error
    try:
        yield port
    finally:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pg(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)
