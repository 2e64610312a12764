"""Why a semaphore over independent masters is built of slot mutexes, proved two ways.

(a) A property test over failure patterns, on real masters with the real scripts: each permit is
    asked for while some masters are unreachable (the request never reaches them), in any order,
    any slot. A per-master counter capped at N with a majority quorum lets N+1 permits be valid
    (hypothesis finds the pattern); the slot design never does, whatever the slots asked for.
(b) The chaos check "never more than N valid permits", on records of real clients under real
    faults: it trips on the naive semaphore and stays at 0 with ours.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, example, find, given, settings
from hypothesis import strategies as st

from bench.chaos.permits import (
    NAIVE_ADMIT,
    NaiveSemaphore,
    Stretch,
    beside_writer,
    engine_section,
    naive_section,
    over_limit,
    partitioned_apart,
    pause_in_turn,
    run,
)
from django_redlock.engine import Redlock
from django_redlock.engine.algorithm.markers import permits as marker
from django_redlock.engine.base import protocol
from django_redlock.engine.scripts import plain as scripts
from django_redlock.engine.scripts.permits import PERMIT_ACQUIRE
from django_redlock.testing.proxy import DelayProxy

pytestmark = pytest.mark.slow

MEMBERS = 5
QUORUM = protocol.quorum(MEMBERS)

#: A failure pattern: per acquisition, which members its request reached, and (for the slot
#: design) which slot the masters start looking from: any, as an adversary would pick.
patterns = st.integers(min_value=1, max_value=3).flatmap(
    lambda limit: st.tuples(
        st.just(limit),
        st.lists(
            st.tuples(
                st.sets(st.integers(0, MEMBERS - 1), min_size=QUORUM),
                st.integers(0, limit - 1),
            ),
            min_size=1,
            max_size=2 * limit + 2,
        ),
    )
)


def valid_permits(clients, design: str, limit: int, acquisitions) -> int:
    """Play one failure pattern on the masters; how many permits are valid at the end (all are
    still held: the long TTL outlasts the pattern). A lost attempt is undone where it landed,
    as the engine does; for slots, as the engine counts: a quorum must take the same slot."""
    for client in clients:
        client.flushall()
    valid = 0
    for n, (reached, start) in enumerate(acquisitions):
        token = f"{n:032x}:{{}}"
        said = {}
        for member in sorted(reached):
            if design == "naive":
                said[member] = clients[member].eval(NAIVE_ADMIT, 1, "naive", token, limit, 60_000)
            else:
                command = PERMIT_ACQUIRE.evalsha(
                    ("redlock:lock:sem", "redlock:queue:sem"),
                    (token, 60_000, marker(limit), "", 0, "redlock:slot:sem#", limit, start),
                )
                said[member] = clients[member].evalsha(*command[1:])
        if design == "naive":
            if sum(s == 1 for s in said.values()) >= QUORUM:
                valid += 1
            else:  # undo, as a lost attempt does
                for member, s in said.items():
                    if s == 1:
                        clients[member].zrem("naive", token)
            continue
        slots = Counter(s for s in said.values() if isinstance(s, int) and s >= 1)
        best, votes = slots.most_common(1)[0] if slots else (0, 0)
        won = votes >= QUORUM
        valid += won
        for member, s in said.items():
            if isinstance(s, int) and s >= 1 and (s != best or not won):
                release = scripts.RELEASE.evalsha(
                    (f"redlock:slot:sem#{s - 1}", "redlock:queue:sem"), (token, "", "", "", "")
                )
                clients[member].evalsha(*release[1:])
    return valid


@pytest.fixture
def clients(masters):
    made = [m.client() for m in masters]
    for client in made:
        client.script_load(PERMIT_ACQUIRE.source)
        client.script_load(scripts.RELEASE.source)
    yield made
    for client in made:
        client.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(patterns)
# Masters that disagree on which slot is free: B takes slot 0 on two masters and slot 1 on one,
# C slot 1 on three. Counting every grant as a vote (not per slot) would make 3 of 2 valid.
@example((2, [({0, 1, 2}, 0), ({2, 3, 4}, 0), ({0, 1, 3}, 0)]))
def test_slot_mutexes_never_give_more_than_limit_valid_permits(clients, pattern):
    limit, acquisitions = pattern
    assert valid_permits(clients, "slots", limit, acquisitions) <= limit


def test_a_counter_per_master_with_a_majority_quorum_gives_more(clients):
    """Hypothesis searches the failure patterns for one that gives the naive semaphore N+1
    valid permits, and finds one (the issue's: N=2 on 5 masters, each permit acquired while a
    different pair of members is unreachable)."""
    limit, acquisitions = find(
        patterns,
        lambda p: valid_permits(clients, "naive", p[0], p[1]) > p[0],
        # Found in the search phase; shrinking it would cost seconds and prove nothing more.
        settings=settings(max_examples=500, database=None, deadline=None, phases=[Phase.generate]),
    )
    assert valid_permits(clients, "naive", limit, acquisitions) > limit
    # The same pattern, on slots: within the limit.
    assert valid_permits(clients, "slots", limit, acquisitions) <= limit


# --- (b) the chaos check -------------------------------------------------------------------------


def test_the_sweep_counts_holders_open_at_once():
    a, b, c = Stretch("permit", 0, 9, 3), Stretch("permit", 1, 9, 4), Stretch("permit", 2, 9, 5)
    assert over_limit([a, b, c], 3) == []
    assert over_limit([a, b, c], 2) == [(2, 3)]
    assert over_limit([a, b, Stretch("permit", 3, 9, 5)], 2) == []  # touching: one let go
    assert over_limit([a, b, Stretch("permit", 2, 2.5, 9), c], 2) == [(2, 3), (2, 4), (2.5, 3)]
    writer = Stretch("writer", 4.5, 9, 6)
    assert beside_writer([a, b, writer]) == []
    assert beside_writer([a, c, writer]) == [(writer, c)]


CHAOS_LIMIT, CHAOS_CLIENTS, CHAOS_HOLD = 2, 5, 0.15


@pytest.fixture
def views(masters):
    """Per client, a proxy in front of each master: its own view of the network."""
    with contextlib.ExitStack() as stack:
        yield [
            [stack.enter_context(DelayProxy(m.port)) for m in masters] for _ in range(CHAOS_CLIENTS)
        ]


def test_the_chaos_check_trips_on_the_naive_semaphore(views):
    """Each client cut off from a different pair of masters: every client still has a
    majority, and the per-master counters let a third permit in beside two."""
    semaphores = [
        NaiveSemaphore([p.url for p in view], "naive", CHAOS_LIMIT, ttl=2.0) for view in views
    ]
    try:
        sections = [naive_section(s, CHAOS_HOLD) for s in semaphores]
        # The hazard needs three clients inside at once: likely in one run, not certain on a
        # loaded machine, so up to three runs (a checker that cannot trip never would).
        for _ in range(3):
            recorded = run(sections, 20, partitioned_apart(views))
            assert recorded
            if over_limit(recorded, CHAOS_LIMIT):
                break
    finally:
        for semaphore in semaphores:
            semaphore.close()
    assert over_limit(recorded, CHAOS_LIMIT)


@pytest.mark.parametrize("fault", ["partitioned-apart", "paused-in-turn", "two-down"])
def test_the_chaos_check_stays_at_zero_with_slot_mutexes(masters, views, fault):
    engines = [Redlock([p.url for p in view], node_timeout=0.03) for view in views]
    sections = [
        engine_section(e, "chaos", CHAOS_HOLD, "permit", limit=CHAOS_LIMIT, ttl=2.0, wait=3.0)
        for e in engines
    ]
    if fault == "two-down":
        masters[1].kill()
        masters[4].kill()
    # Every run must stay within the limit; and the limit must have been reached in one of them,
    # so that the check had something to see (a loaded machine may serve a run one at a time:
    # three runs once did, in the README's run as a non-root user; up to five, stopping at the
    # first that reached it).
    for seed in range(1, 6):
        if fault == "two-down":
            recorded = run(sections, 6, None)
        elif fault == "paused-in-turn":
            recorded = run(sections, 6, pause_in_turn(masters, 0.1, seed=seed))
        else:
            recorded = run(sections, 6, partitioned_apart(views))
        assert len(recorded) >= CHAOS_CLIENTS * 6 // 2
        assert over_limit(recorded, CHAOS_LIMIT) == []
        if over_limit(recorded, CHAOS_LIMIT - 1):
            break
    closing = [threading.Thread(target=e.close) for e in engines]  # at once: each joins threads
    for thread in closing:
        thread.start()
    for thread in closing:
        thread.join()
    assert over_limit(recorded, CHAOS_LIMIT - 1)
