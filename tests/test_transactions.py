"""Held until the transaction ends: each check of tests/transaction_checks.py, in a child
process on SQLite (a file) and on a throwaway PostgreSQL cluster; and the opt-out's bad values,
refused before any network call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import transaction_checks
from tests.conftest import ROOT

NAMES = [check.__name__ for check in transaction_checks.CHECKS]


def run_checks(env: dict[str, str], masters: list) -> list[str]:
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "tests.transaction_checks"],
        cwd=ROOT,
        env={
            **os.environ,
            **env,
            "REDLOCK_NODES": ",".join(m.url for m in masters),
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    lines = result.stdout.split("\n")
    assert [line for line in lines if line.startswith("OK ")] == [f"OK {n}" for n in NAMES]
    assert "DONE" in lines
    return lines


def test_on_sqlite(masters, tmp_path: Path) -> None:
    lines = run_checks({"REDLOCK_TEST_DB": str(tmp_path / "db.sqlite3")}, masters)
    assert lines[0] == "VENDOR sqlite"


def test_on_postgresql(postgres_port, masters) -> None:
    lines = run_checks({"REDLOCK_TEST_PG": str(postgres_port)}, masters)
    assert lines[0] == "VENDOR postgresql"
