"""A pytest plugin: real local Redis masters for a project's own tests.

Enable it with ``-p django_redlock.testing.plugin`` (``addopts`` in pytest's configuration), then::

    def test_checkout_is_locked(client, redlock_settings):
        ...  # settings.REDLOCK points at three fresh, empty masters

``redlock_masters`` gives the ``LocalMaster`` objects themselves, for faults
(``redlock_masters[0].kill()``); a fault left behind is undone before the next test. The masters
start once per session; a test that cannot get them fails with the reason, it never skips.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .masters import LocalMaster, local_masters

#: Masters started for the session: three, so that one may fail and locks still work.
MASTERS = 3


@pytest.fixture(scope="session")
def _redlock_session_masters(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[LocalMaster]]:
    with local_masters(MASTERS, tmp_path_factory.mktemp("redlock-masters")) as masters:
        yield masters


@pytest.fixture
def redlock_masters(_redlock_session_masters: list[LocalMaster]) -> list[LocalMaster]:
    """Healthy, empty local masters (shared by the session; healed and flushed per test)."""
    for master in _redlock_session_masters:
        master.heal()
    return _redlock_session_masters


@pytest.fixture
def redlock_settings(settings: Any, redlock_masters: list[LocalMaster]) -> list[LocalMaster]:
    """``settings.REDLOCK["NODES"]`` pointing at ``redlock_masters`` (other keys kept)."""
    current = dict(getattr(settings, "REDLOCK", None) or {})
    current["NODES"] = [m.url for m in redlock_masters]
    settings.REDLOCK = current
    return redlock_masters
