"""The pytest plugin that ships for users' own tests, run as a user would: a project's test file
using ``redlock_masters`` and ``redlock_settings``, in a pytest of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

USERS_TEST = """
from django.conf import settings

from django_redlock import LockContended, redlock
from django_redlock.conf import get_redlock


def test_settings_point_at_three_fresh_masters(redlock_settings, redlock_masters):
    assert settings.REDLOCK["NODES"] == [m.url for m in redlock_masters]
    assert len(redlock_masters) == 3
    with redlock("checkout:1", ttl=5):
        redlock_masters[0].kill()  # one of three down: locks still work
        try:
            with redlock("checkout:1", ttl=5):
                raise AssertionError("acquired twice")
        except LockContended:
            pass
    get_redlock().close()


def test_a_fault_left_behind_is_healed(redlock_masters):
    assert all(m.alive for m in redlock_masters)
    assert all(m.client().dbsize() == 0 for m in redlock_masters)
"""


def test_users_tests_get_real_masters_through_the_plugin(tmp_path):
    (tmp_path / "test_users.py").write_text(textwrap.dedent(USERS_TEST))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "django_redlock.testing.plugin",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout


def test_a_master_whose_port_another_server_took_is_not_taken_for_ours(tmp_path):
    """A port free when probed can be taken by another server (another test worker's) before
    ours binds it: start() must not return with the tests talking to that other server."""
    import pytest

    from django_redlock.testing.masters import LocalMaster

    first = LocalMaster(tmp_path / "first").start()
    try:
        second = LocalMaster(tmp_path / "second", first.port)
        with pytest.raises(RuntimeError, match=f"redis-server on port {first.port} exited"):
            second.start()
        assert not second.alive
    finally:
        first.stop()
