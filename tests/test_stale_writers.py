"""The paused holder writes (RELIABILITY.md, "paused holder writes"), with the chaos checkers.

A holder opens a transaction and reads the ledger row (the read of a read-modify-write); it is
SIGSTOPped past its TTL (its renewal thread with it); another process takes the lock, reads and
writes the row; the first resumes and writes what it computed. On PostgreSQL (READ COMMITTED:
the stale UPDATE is not refused by the database itself), 5 real masters, real processes.

- with the DB guard: its UPDATE never reaches the database: 0 lost updates;
- with only the fence: the UPDATE reaches the database and is refused there: 0 lost updates;
- with neither: the checker trips (a lost update), which shows the hazard and that it can fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench.chaos.checkers import Section, Verdict, check
from tests.conftest import ROOT

pytestmark = pytest.mark.slow

TTL = 0.5
PAUSED = 3 * TTL  # the stopped holder's lease runs out a full second before it resumes


class Writer:
    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "tests.stale_writer", str(TTL)],
            cwd=ROOT,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.read() == "READY"

    def read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"writer died: {self.proc.communicate(timeout=10)[1]}")
        return line.strip()

    def say(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def hold(self, config: tuple[str, str]) -> dict[str, object]:
        self.say("hold " + " ".join(config))
        return json.loads(self.read())

    def write(self, worker: str) -> Section:
        self.say("write")
        record = json.loads(self.read())
        note = str(record.pop("note", ""))
        return Section(worker=worker, seq=0, note=note, **record)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.communicate(timeout=10)


def ledger_value(port: int) -> int:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres") as db:
        row = db.execute("SELECT value FROM fencedapp_ledger WHERE name = 'stale-writers'")
        return int(row.fetchone()[0])  # type: ignore[index]


@pytest.fixture(scope="module")
def writers(postgres_port, _shared_masters) -> Iterator[tuple[Writer, Writer]]:
    """Two holder processes, started once (Django's start-up is the slow part)."""
    env = {
        **os.environ,
        "REDLOCK_NODES": ",".join(m.url for m in _shared_masters[5]),
        "REDLOCK_TEST_PG": str(postgres_port),
        "PYTHONPATH": str(ROOT),
    }
    stale = Writer(env)
    try:
        fresh = Writer(env)  # started after the first one migrated
        try:
            yield stale, fresh
        finally:
            fresh.close()
    finally:
        stale.close()


def paused_holder_writes(
    config: tuple[str, str], writers: tuple[Writer, Writer], port: int
) -> Verdict:
    stale, fresh = writers
    stale.say("reset")
    assert stale.read() == "OK"
    held = stale.hold(config)
    os.kill(int(held["pid"]), signal.SIGSTOP)  # type: ignore[call-overload]
    stopped = time.monotonic()
    try:
        fresh.hold(config)  # waits until the stopped holder's lease has run out
        newer = fresh.write("fresh")
        time.sleep(max(0.0, PAUSED - (time.monotonic() - stopped)))
    finally:
        os.kill(int(held["pid"]), signal.SIGCONT)  # type: ignore[call-overload]
    older = stale.write("stale")
    sections = [older, newer]
    accepted = [s.fence for s in sorted(sections, key=lambda s: s.wrote_at or 0) if s.fenced]
    return check(sections, ledger_value(port), [f for f in accepted if f is not None])


def test_with_the_db_guard_the_paused_holders_write_never_reaches_the_database(
    writers, postgres_port, masters
):
    verdict = paused_holder_writes(("guard", "nofence"), writers, postgres_port)
    assert verdict.lost_updates == 0, verdict
    assert (verdict.counted, verdict.counter) == (1, 1), verdict  # only the fresh holder wrote
    assert verdict.violations == 0, verdict


def test_with_only_the_fence_the_database_refuses_the_stale_write(writers, postgres_port, masters):
    verdict = paused_holder_writes(("noguard", "fence"), writers, postgres_port)
    assert verdict.lost_updates == 0, verdict
    assert (verdict.stale_writes, verdict.stale_rejected) == (1, 1), verdict
    assert verdict.violations == 0, verdict


def test_without_guard_and_fence_the_checker_catches_the_lost_update(
    writers, postgres_port, masters
):
    verdict = paused_holder_writes(("noguard", "nofence"), writers, postgres_port)
    assert (verdict.counted, verdict.counter) == (2, 1), verdict  # both wrote 0 + 1
    assert verdict.lost_updates == 1, verdict
    assert verdict.violations > 0, verdict
