"""The fault-injection suite at CI size: 3 client processes x 20 critical sections per scenario,
on real redis-server masters with real faults (see bench/chaos/). Every scenario must keep every
guarantee, except four that exist to fail: the restart-empty, Sentinel-failover and clock-step
hazards must be *detected*, and the checker self-test (a quorum of 1) must trip every checker.
``python -m bench.chaos`` runs the same scenarios at full size (8 x 250)."""

from __future__ import annotations

import pytest

from bench.chaos.__main__ import main
from bench.chaos.scenarios import CI, SCENARIOS, Result, Size, soak

pytestmark = pytest.mark.slow

MUST_TRIP = {"restart-empty-hazard", "clock-step-hazard", "sentinel-failover-hazard", "self-test"}


def explain(result: Result) -> str:
    verdict = result.outcome.verdict
    return (
        f"{result.name}: {verdict} failed checks {result.failed_checks()}; notes {result.notes}; "
        f"events {result.outcome.events}; failures {result.outcome.failures[:3]}"
    )


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n not in MUST_TRIP])
def test_scenario_keeps_every_guarantee(name, tmp_path):
    result = SCENARIOS[name].run(CI, tmp_path)
    verdict = result.outcome.verdict
    assert result.failed_checks() == [], explain(result)
    assert verdict.lost_updates == 0, explain(result)
    assert verdict.overlaps == 0, explain(result)
    assert verdict.expired_handouts == 0, explain(result)
    assert verdict.fence_violations == 0, explain(result)
    assert verdict.sections >= result.outcome.done > 0


def test_a_master_restarted_empty_within_the_ttl_is_caught_by_the_checkers(tmp_path):
    """The documented hazard: a holder's majority loses a member that comes back empty at once,
    and the next client wins a majority with it. Two holders at once: the sweep sees it."""
    result = SCENARIOS["restart-empty-hazard"].run(CI, tmp_path)
    assert result.failed_checks() == [], explain(result)
    assert result.outcome.verdict.overlaps > 0, explain(result)
    assert result.ok


def test_a_sentinel_failover_to_a_lagging_replica_under_a_bare_quorum_is_caught(tmp_path):
    """Without quarantine: a holder on a bare quorum that included a Sentinel member's primary,
    which fails over to a replica that never received the key; the next client wins with it.
    (``sentinel-failover-quarantined``, the same with quarantine, keeps every guarantee.)"""
    result = SCENARIOS["sentinel-failover-hazard"].run(CI, tmp_path)
    assert result.failed_checks() == [], explain(result)
    assert result.outcome.verdict.overlaps > 0, explain(result)
    assert result.ok


def test_a_majority_of_clocks_stepped_forward_is_caught_by_the_checkers(tmp_path):
    """The wall-clock hazard: Redis expires keys by each master's wall clock, so a step forward
    on a majority ends the holder's copies early and a second client wins: the sweep sees it."""
    result = SCENARIOS["clock-step-hazard"].run(CI, tmp_path)
    assert result.failed_checks() == [], explain(result)
    assert result.outcome.verdict.overlaps > 0, explain(result)
    assert result.ok


def test_the_checker_self_test_trips_every_checker(tmp_path):
    """A quorum of 1 (patched inside the client processes only) lets two clients hold the lock
    at once: lost updates, overlaps and fence violations must all be reported."""
    # Larger than CI size: overlaps and lost updates show at once, but a fence violation needs an
    # overlapping pair whose tokens were issued out of acquisition order (a matter of timing);
    # 6 x 60 broken sections make one near-certain and still take only a few seconds.
    result = SCENARIOS["self-test"].run(Size(6, 60), tmp_path)
    verdict = result.outcome.verdict
    assert verdict.lost_updates > 0, explain(result)
    assert verdict.overlaps > 0, explain(result)
    assert verdict.fence_violations > 0, explain(result)
    assert result.ok


def test_a_short_soak_with_random_faults_keeps_every_guarantee(tmp_path):
    result = soak(12.0, 3, tmp_path, seed=5)
    assert result.failed_checks() == [], explain(result)
    assert result.violations == 0, explain(result)
    assert result.outcome.done > 0
    assert result.notes[0].startswith("faults: ")
    assert "none" not in result.notes[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--processes", "1"], "need --processes >= 2 and --sections >= 3, got 1, 250"),
        (["--sections", "2"], "got 8, 2"),
        (["--soak", "3"], "--soak must be at least 10 seconds, got 3.0"),
        (["--scenario", "nope"], "invalid choice: 'nope'"),
    ],
)
def test_the_command_rejects_bad_sizes_before_starting_anything(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
