"""The seeded fuzzer (bench/fuzz): its checker on made-up histories, two short fixed-seed runs
over real masters with faults, and the checker tripping on deliberately broken locks.

The runs' verdicts judge histories, not timings (bench/fuzz/history.py): a loaded machine makes
fewer sections, never a violation. ``cpu`` (two busy loops) is left out of the in-suite mix so as
not to slow the other worker's tests; ``python -m bench.fuzz --faults all`` runs it.
"""

from __future__ import annotations

import pytest

from bench.fuzz.history import Section, check
from bench.fuzz.run import MIXES, Options, run

pytestmark = pytest.mark.slow


def section(caller: str, kind: str, resources: tuple[str, ...], start: float, end: float,
            **fields: object) -> Section:  # fmt: skip
    values: dict[str, object] = {
        "caller": caller,
        "seq": 0,
        "kind": kind,
        "resources": resources,
        "ttl": 10.0,
        "acquired": start,
        "valid_until": start + 5.0,
        "released": end,
        "renewed": start,
    }
    values.update(fields)
    return Section(**values)  # type: ignore[arg-type]


def _fields(s: Section) -> dict[str, object]:
    return {f: getattr(s, f) for f in Section.__dataclass_fields__}


def rules(sections: list[Section], **kwargs: object) -> list[str]:
    options: dict[str, object] = {"counters": {}, "accepted": {}, "limits": {"p": 2}}
    options.update(kwargs)
    return sorted({v.rule for v in check(sections, **options).violations})  # type: ignore[arg-type]


def test_a_correct_history_passes() -> None:
    history = [
        section("a", "plain", ("r",), 0.0, 1.0, fences={"r": 1}, counted=("r",)),
        section("b", "multi", ("r", "s"), 1.0, 2.0, fences={"r": 2}, counted=("r", "s")),
        section("c", "reader", ("rw",), 0.0, 2.0),
        section("d", "reader", ("rw",), 1.0, 3.0),
        section("e", "writer", ("rw",), 3.0, 4.0),
        section("f", "permit", ("p",), 0.0, 2.0),
        section("g", "permit", ("p",), 0.5, 2.0),
        section("h", "permit", ("p",), 2.0, 3.0),
    ]
    assert rules(history, counters={"r": 2, "s": 1, "rw": 0}, accepted={"r": [1, 2]}) == []


def test_each_rule_trips_on_its_own_violation() -> None:
    overlap = [section("a", "plain", ("r",), 0.0, 2.0), section("b", "multi", ("s", "r"), 1.0, 3.0)]
    assert rules(overlap) == ["exclusive"]
    # A section past its validity overlapping the next holder is no violation.
    expired = [
        section("a", "plain", ("r",), 0.0, 9.0, valid_until=1.0),
        section("b", "plain", ("r",), 2.0, 3.0),
    ]
    assert rules(expired) == []
    too_many = [section(x, "permit", ("p",), 0.0, 1.0) for x in "abc"]
    assert rules(too_many) == ["permits"]
    beside = [section("a", "writer", ("rw",), 0.0, 2.0), section("b", "reader", ("rw",), 1.0, 3.0)]
    assert rules(beside) == ["readers"]
    fences = [
        section("a", "plain", ("r",), 0.0, 1.0, fences={"r": 5}),
        section("b", "plain", ("r",), 1.0, 2.0, fences={"r": 5}),
    ]
    assert rules(fences) == ["fences"]
    assert rules([], accepted={"r": [3, 2]}) == []  # no section of r: nothing to judge
    assert rules(fences[:1], accepted={"r": [5, 4]}) == ["fences"]
    lost = [section("a", "plain", ("r",), 0.0, 1.0, counted=("r",)),
            section("b", "plain", ("r",), 1.0, 2.0, counted=("r",))]  # fmt: skip
    assert rules(lost, counters={"r": 1}) == ["counter"]
    untruthful = [section("a", "plain", ("r",), 0.0, 11.0, valid_until=1.0, release="ok")]
    assert rules(untruthful) == ["release"]
    told = [section("a", "plain", ("r",), 0.0, 11.0, valid_until=1.0, release="lost")]
    assert rules(told) == []
    # owned() said "ours" while another holder was valid for the whole question. (The two
    # sections overlap too; a history where they do not is the correct one below.)
    lied = [
        section("a", "plain", ("r",), 0.0, 3.0, valid_until=0.5, owned=(1.0, 1.1, True)),
        section("b", "plain", ("r",), 0.6, 2.0),
    ]
    assert rules(lied) == ["owned"]
    honest = [lied[0].__class__(**{**_fields(lied[0]), "owned": (1.0, 1.1, False)}), lied[1]]
    assert rules(honest) == []


@pytest.mark.parametrize(
    ("seed", "mix"),
    [(11, MIXES["masters"]), (12, tuple(f for f in MIXES["clients"] if f != "cpu"))],
    ids=["masters", "clients"],
)
def test_a_fixed_seed_run_under_faults_has_no_violation(seed: int, mix: tuple[str, ...]) -> None:
    outcome = run(Options(seconds=10, seed=seed, faults=mix, ttl=1.0))
    verdict = outcome.verdict
    assert not outcome.stderr, outcome.stderr
    assert verdict.ok, "\n".join([verdict.summary(), *map(str, verdict.violations[:20])])
    # The run did what it is for: every kind of section, and faults made.
    # (Bounds a slow machine keeps: 10 s make hundreds of sections on a loaded 2-CPU machine.)
    assert len(verdict.by_kind) >= 4, verdict.summary()
    assert verdict.sections >= 50, verdict.summary()
    assert sum(outcome.faults_made.values()) >= 1, outcome.faults_made


@pytest.mark.parametrize(
    ("broken", "faults", "expected"),
    [("quorum1", (), "exclusive"), ("setnx-one", ("pause",), "exclusive")],
)
def test_the_checker_trips_on_a_broken_lock(
    broken: str, faults: tuple[str, ...], expected: str
) -> None:
    outcome = run(Options(seconds=4, seed=3, faults=faults, broken=broken, ttl=1.0))
    found = {v.rule for v in outcome.verdict.violations}
    assert expected in found, outcome.verdict.summary()


def test_the_django_workload_loses_no_update_and_lets_no_older_token_win() -> None:
    """lock_view under ATOMIC_REQUESTS, redlock() inside atomic and fenced updates through a
    join, on PostgreSQL, single-caller processes stopping between their lock's block and their
    COMMIT (and between the token and the fenced update) past their lease, some killed."""
    outcome = run(
        Options(seconds=8, seed=21, faults=("stop", "kill"), processes=0, solo=1, django=3, ttl=1.0)
    )
    verdict = outcome.verdict
    assert not outcome.stderr, outcome.stderr
    assert verdict.ok, "\n".join([verdict.summary(), *map(str, verdict.violations[:20])])
    assert all(verdict.by_kind[f"django-{k}"] >= 3 for k in ("view", "with", "fenced")), (
        verdict.summary()
    )


def test_the_django_workload_trips_when_locks_are_released_before_commit() -> None:
    outcome = run(
        Options(
            seconds=6, seed=22, faults=(), processes=0, solo=0, django=3, ttl=1.0,
            broken="release-before-commit",
        )
    )  # fmt: skip
    assert "counter" in {v.rule for v in outcome.verdict.violations}, outcome.verdict.summary()
