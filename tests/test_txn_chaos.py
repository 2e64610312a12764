"""The paused holder commits late (issue 33, item 4): a lock held until its transaction ends.

Three processes increment one PostgreSQL row (read, +1, save) under the lock "txn-chaos":
through ``lock_view`` under ``ATOMIC_REQUESTS``, or through ``with redlock()`` inside the
caller's ``atomic``. The first is SIGSTOPped after its lock's block ended and before its
transaction commits (its renewal thread with it), past its lease; the two others increment
meanwhile; then the first resumes and commits. Real masters, real processes, real PostgreSQL
(READ COMMITTED). The lost-update checker of bench/chaos/checkers.py judges each run:

- by default the lock waits for the commit: the paused holder's lease runs out before its
  commit, which is refused (rolled back): 0 lost updates, and the two others both count;
- with ``release_before_commit=True`` the lock was free before the paused holder's commit: the
  others read the row as it was before it, and the checker trips.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest

from bench.chaos.checkers import Section, lost_updates
from tests.conftest import ROOT
from tests.line_child import LineChild

pytestmark = pytest.mark.slow

TTL = 1.0
PAUSED = 2 * TTL  # the stopped holder's lease runs out a full TTL before it resumes


class Holder(LineChild):
    def __init__(self, env: dict[str, str]) -> None:
        super().__init__(env, "tests.txn_writer", str(TTL))

    def section(self, worker: str) -> Section:
        record = json.loads(self.read())
        return Section(worker=worker, seq=0, **record)


def counter(port: int) -> int:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres") as db:
        row = db.execute("SELECT value FROM fencedapp_ledger WHERE name = 'txn-chaos'")
        return int(row.fetchone()[0])  # type: ignore[index]


@pytest.fixture(scope="module")
def holders(postgres_port, _shared_masters) -> Iterator[list[Holder]]:
    """Three holder processes, started once (Django's start-up is the slow part)."""
    env = {
        **os.environ,
        "REDLOCK_NODES": ",".join(m.url for m in _shared_masters[5]),
        "REDLOCK_TEST_PG": str(postgres_port),
        "PYTHONPATH": str(ROOT),
    }
    first = Holder(env)
    started = [first]
    try:
        started += [Holder(env), Holder(env)]  # (the first migrated: they find the tables)
        yield started
    finally:
        for holder in started:
            holder.close()


def paused_before_commit(how: str, mode: str, holders: list[Holder], port: int) -> list[Section]:
    paused, *others = holders
    paused.say("reset")
    assert paused.read() == "OK"
    paused.say(f"add {how} {mode} pause")
    pid = int(json.loads(paused.read())["pid"])  # its block ended; its transaction is open
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        for other in others:
            other.say(f"add {how} {mode} go")
        time.sleep(max(0.0, PAUSED - (time.monotonic() - stopped)))
    finally:
        os.kill(pid, signal.SIGCONT)
    paused.say("commit")
    return [paused.section("paused")] + [o.section(f"other{i}") for i, o in enumerate(others)]


@pytest.mark.parametrize("how", ["view", "with"])
def test_by_default_the_paused_holders_late_commit_is_refused(how, holders, postgres_port):
    sections = paused_before_commit(how, "default", holders, postgres_port)
    value = counter(postgres_port)
    assert lost_updates(sections, value) == 0, (value, sections)
    assert [s.counted for s in sections] == [False, True, True], sections
    assert value == 2
    assert "rolled back instead of committed" in sections[0].note or "500" in sections[0].note


@pytest.mark.parametrize("how", ["view", "with"])
def test_with_release_before_commit_the_checker_catches_the_lost_update(
    how, holders, postgres_port
):
    sections = paused_before_commit(how, "early", holders, postgres_port)
    value = counter(postgres_port)
    assert [s.counted for s in sections] == [True, True, True], sections
    assert lost_updates(sections, value) >= 1, (value, sections)
