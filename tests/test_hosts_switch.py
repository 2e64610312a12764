"""The switch that turns the separate-hosts tests off on a root machine, where they otherwise run
(namespaces, veth pairs, tc) without asking."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_redlock_skip_hosts_turns_the_separate_hosts_tests_off() -> None:
    env = {**os.environ, "REDLOCK_SKIP_HOSTS": "1"}
    env.pop("REDLOCK_REQUIRE_HOSTS", None)
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
    result = subprocess.run(  # noqa: S603
        [*command, "tests/test_hosts.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "turned off (REDLOCK_SKIP_HOSTS=1)" in result.stdout
    assert " passed" not in result.stdout
    assert "failed" not in result.stdout
