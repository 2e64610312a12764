"""The hot-key table's figures (``bench/handoff.py``, scenario j) mean what the README says: pure
arithmetic on timelines, checked on made-up races (no Redis, no timing)."""

from __future__ import annotations

import math

import pytest

from bench.contention import Race
from bench.handoff import handoffs, jain


def race(*processes: list[tuple[int, int]]) -> Race:
    return Race(holds_by_process=list(processes))


def turns(n: int, rounds: int) -> Race:
    """n processes taking the lock in turn, ``rounds`` times each, 2 time units per hold."""
    holds: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    t = 0
    for _ in range(rounds):
        for p in range(n):
            holds[p].append((t, t + 2))
            t += 3
    return race(*holds)


def test_processes_taking_turns_are_fair_and_hand_off_every_time() -> None:
    taken = turns(8, 25)
    # The window ends at the first process's last release: the 7 others' last holds come
    # after it, so 25 against 24 each, 0.9998.
    assert jain(taken) == pytest.approx(1.0, abs=1e-3)
    assert handoffs(taken) == 8 * 25 - 1


def test_one_process_taking_all_its_holds_first_scores_one_over_n() -> None:
    # Process 0 barges: its 25 holds come first; the others get theirs after it is done.
    first = [(3 * i, 3 * i + 2) for i in range(25)]
    others = [[(1000 + 100 * p, 1000 + 100 * p + 2)] for p in range(7)]
    taken = race(first, *others)
    assert jain(taken) == pytest.approx(1 / 8)
    assert handoffs(taken) == 7  # 0 -> 1 -> 2 ... -> 7: one hand-off per later process


def test_shares_count_only_while_everyone_was_still_asking() -> None:
    # Two processes alternate 3 times each, then process 0 goes on alone after process 1 is
    # done: its extra holds came when nobody else wanted the lock, and are not unfairness.
    zero = [(0, 1), (4, 5), (8, 9), (12, 13), (14, 15)]
    one = [(2, 3), (6, 7), (10, 11)]
    assert jain(race(zero, one)) == pytest.approx(1.0)
    assert handoffs(race(zero, one)) == 6  # 0 1 0 1 0 1 0 0


def test_a_process_that_reported_nothing_makes_the_index_unknown() -> None:
    assert math.isnan(jain(race([(0, 1)], [])))
    assert math.isnan(jain(race()))
