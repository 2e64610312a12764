"""The paused holder writes (RELIABILITY.md, "paused holder writes"), with the chaos checkers.

A holder opens a transaction and reads the ledger row (the read of a read-modify-write); it is
SIGSTOPped past its TTL (its renewal thread with it); another process takes the lock, reads and
writes the row; the first resumes and writes what it computed. On PostgreSQL (READ COMMITTED:
the stale UPDATE is not refused by the database itself), 5 real masters, real processes.

- with the DB guard: its UPDATE never reaches the database: 0 lost updates;
- with only the fence: the UPDATE reaches the database and is refused there: 0 lost updates;
- with neither: the checker trips (a lost update), which shows the hazard and that it can fail.

The fence races (``fence_races``): three processes take turns writing, with the fence only,
over a join and on a multi-table child; each round, the holder is SIGSTOPped past its lease,
the next one writes (its transaction still open), the first resumes and writes while the newer
write holds the row, then the newer one commits. With the fence in the statement that writes:
0 lost updates, 0 fence regressions, no older token accepted. With the fence only in the rows'
selection (as 531ce3f wrote it), the checkers trip.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from bench.chaos.checkers import Section, Verdict, check
from tests.conftest import ROOT, wait_until
from tests.line_child import LineChild

pytestmark = pytest.mark.slow

#: The holders' lease, auto-extended: 1 s, renewed every 1/3 s, so that the fresh holder keeps
#: it through its write on a loaded machine (0.5 s left a renewal 1/3 s).
TTL = 1.0
PAUSED = TTL + 1.0  # the stopped holder's lease runs out a full second before it resumes


class Writer(LineChild):
    def __init__(
        self, env: dict[str, str], module: str = "tests.stale_writer", ttl: float = TTL
    ) -> None:
        super().__init__(env, module, str(ttl))

    def hold(self, config: tuple[str, str]) -> dict[str, object]:
        return self.ask("hold " + " ".join(config))  # type: ignore[no-any-return]

    def write(self, worker: str) -> Section:
        record = self.ask("write")
        note = str(record.pop("note", ""))
        return Section(worker=worker, seq=0, note=note, **record)


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


# --- fence races: fenced updates over a join and on a multi-table child -------------------------

RACE_TTL = 1.0


@pytest.fixture(scope="module")
def racers(postgres_port, _shared_masters) -> Iterator[list[Writer]]:
    """Three holder processes of tests.fence_racer, started one after the other (the first
    one migrates)."""
    env = {
        **os.environ,
        "REDLOCK_NODES": ",".join(m.url for m in _shared_masters[5]),
        "REDLOCK_TEST_PG": str(postgres_port),
        "PYTHONPATH": str(ROOT),
    }
    started: list[Writer] = []
    try:
        for _ in range(3):
            started.append(Writer(env, "tests.fence_racer", RACE_TTL))
        yield started
    finally:
        for racer in started:
            racer.close()


def pg(port: int, sql: str, *params: object) -> Any:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres") as db:
        return db.execute(sql, params).fetchone()


def waits_for_a_row_lock(port: int, backend: int) -> bool:
    row = pg(port, "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", backend)
    return row is not None and row[0] == "Lock"


def shape_row(port: int, shape: str) -> tuple[int, int]:
    """(balance, fence) of the row of ``shape`` (tests.fence_racer's)."""
    if shape == "join":
        sql = (
            "SELECT a.balance, a.fence FROM fencedapp_ownedaccount a JOIN fencedapp_owner o"
            " ON a.owner_id = o.id WHERE o.name = 'fence-race'"
        )
    else:
        sql = (
            "SELECT a.balance, a.fence FROM fencedapp_account a JOIN fencedapp_premiumaccount p"
            " ON p.account_ptr_id = a.id WHERE a.name = 'fence-race'"
        )
    return pg(port, sql)  # type: ignore[no-any-return]


def section_of(worker: str, seq: int, record: dict[str, Any]) -> tuple[Section, float | None]:
    committed = record.pop("committed", None)
    return Section(worker=worker, seq=seq, **record), committed


def fence_races(
    racers: list[Writer], port: int, mode: str, rounds: int
) -> tuple[Verdict, list[str]]:
    """``rounds`` rounds, alternating the join and the child, each holder in turn the paused
    one. Returns the checkers' verdict and the fence regressions seen (a row whose fence went
    below a token it had accepted)."""
    racers[0].say("seed")
    assert racers[0].read() == "OK"
    sections: list[Section] = []
    commits: list[tuple[float, int]] = []  # (when, token) of each accepted, committed write
    regressions: list[str] = []
    for seq in range(rounds):
        shape = ("join", "child")[seq % 2]
        stale, fresh = racers[seq % 3], racers[(seq + 1) % 3]
        held = stale.ask(f"hold {shape} {mode}")
        os.kill(held["pid"], signal.SIGSTOP)
        try:
            newer = fresh.ask(f"hold {shape} {mode}")  # once the stopped holder's lease ran out
            assert fresh.ask("write") == {"written": 1}, "the newer holder's write was refused"
        finally:
            os.kill(held["pid"], signal.SIGCONT)
        stale.say("write")  # its UPDATE waits for the row the newer holder wrote
        waiting = partial(waits_for_a_row_lock, port, held["backend"])
        assert wait_until(waiting, 30), (
            "the paused holder's UPDATE never waited for the newer holder's row lock"
        )
        for worker, racer in ((f"fresh/{seq}", fresh), (f"stale/{seq}", stale)):
            if racer is stale:
                stale.read()  # {"written": n}, once the newer holder committed
            section, committed = section_of(worker, seq, racer.ask("commit"))
            sections.append(section)
            if section.counted and committed is not None and section.fence is not None:
                commits.append((committed, section.fence))
        balance, fence = shape_row(port, shape)
        if fence < newer["fence"]:
            regressions.append(f"{shape}: fence {fence} after token {newer['fence']} wrote it")
    counter = sum(shape_row(port, shape)[0] for shape in ("join", "child"))
    accepted = [token for _, token in sorted(commits)]
    return check(sections, counter, accepted), regressions


def test_fenced_updates_over_a_join_and_a_child_never_let_an_older_token_win(
    racers, postgres_port, masters
):
    verdict, regressions = fence_races(racers, postgres_port, "fenced", rounds=6)
    assert regressions == [], regressions
    assert verdict.lost_updates == 0, verdict
    assert verdict.violations == 0, verdict
    assert (verdict.stale_writes, verdict.stale_rejected) == (6, 6), verdict
    assert (verdict.counted, verdict.counter) == (6, 6), verdict  # only the newer holders wrote


def test_with_the_fence_only_in_the_selection_the_checkers_trip(racers, postgres_port, masters):
    """The deliberately broken configuration (531ce3f's fenced update): the same races let the
    older token overwrite the newer holder's committed write."""
    verdict, regressions = fence_races(racers, postgres_port, "broken", rounds=2)
    assert len(regressions) == 2, regressions
    assert verdict.lost_updates == 2, verdict  # both holders wrote balance + 1 from one read
    assert verdict.fence_violations >= 2, verdict  # the store accepted a token after a newer
    assert verdict.violations > 0, verdict
