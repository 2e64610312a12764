"""The switch that turns the separate-hosts tests off on a root machine, where they otherwise run
(namespaces, veth pairs, tc) without asking."""

from __future__ import annotations

import importlib

import pytest

import tests.test_hosts


def skipped_when(monkeypatch: pytest.MonkeyPatch, **env: str) -> bool:
    """Whether tests/test_hosts.py's module mark skips it, imported under ``env``."""
    for name in ("REDLOCK_SKIP_HOSTS", "REDLOCK_REQUIRE_HOSTS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    module = importlib.reload(tests.test_hosts)
    [skipif] = [mark for mark in module.pytestmark if mark.name == "skipif"]
    return bool(skipif.args[0])


def test_redlock_skip_hosts_turns_the_separate_hosts_tests_off(monkeypatch) -> None:
    try:
        assert not skipped_when(monkeypatch)  # as root: they run
        assert skipped_when(monkeypatch, REDLOCK_SKIP_HOSTS="1")
        assert not skipped_when(monkeypatch, REDLOCK_SKIP_HOSTS="1", REDLOCK_REQUIRE_HOSTS="1")
    finally:
        monkeypatch.undo()
        importlib.reload(tests.test_hosts)  # as the environment says again
