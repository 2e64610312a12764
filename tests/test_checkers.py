"""The chaos checkers on hand-made records: clean histories pass, and each kind of violation is
caught (a checker that cannot fail proves nothing)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.chaos.checkers import (
    Section,
    accepted_order_violations,
    check,
    expired_handouts,
    fence_order_violations,
    lost_updates,
    overlaps,
    rejected_while_valid,
    stale_writes,
)


def section(
    worker: str,
    seq: int,
    acquired: float,
    released: float,
    *,
    valid_until: float | None = None,
    fence: int | None = None,
    counted: bool = True,
    fenced: bool | None = True,
    wrote_at: float | None = None,
    lost: bool = False,
) -> Section:
    return Section(
        worker=worker,
        seq=seq,
        acquired=acquired,
        valid_until=acquired + 10.0 if valid_until is None else valid_until,
        released=released,
        fence=fence,
        counted=counted,
        fenced=fenced,
        wrote_at=released - 0.01 if wrote_at is None else wrote_at,
        lost=lost,
    )


def serial(n: int) -> list[Section]:
    """n sections one after another, each with the next fence: a correct history."""
    return [section(str(i % 3), i, i * 1.0, i * 1.0 + 0.5, fence=i + 1) for i in range(n)]


# --- a correct history passes every checker ---


def test_a_correct_history_has_no_violation():
    history = serial(10)
    verdict = check(history, counter=10, accepted=[s.fence for s in history if s.fence])
    assert verdict.violations == 0
    assert (verdict.sections, verdict.counted, verdict.counter) == (10, 10, 10)
    assert verdict.examples == ()


def test_touching_sections_do_not_overlap():
    """The next holder starts exactly when the previous one let go: allowed."""
    assert overlaps([section("a", 0, 0.0, 1.0), section("b", 0, 1.0, 2.0)]) == []


def test_overlap_after_the_first_lease_ran_out_is_not_a_violation():
    """A holder paused past validity (valid until 1.0, released at 5.0): a new holder at 2.0 is
    what the lease allows. Exclusivity is promised only within validity."""
    paused = section("a", 0, 0.0, 5.0, valid_until=1.0, fence=1, fenced=False, wrote_at=4.9)
    after = section("b", 0, 2.0, 3.0, fence=2)
    verdict = check([paused, after], counter=2, accepted=[2])
    assert verdict.overlaps == 0
    assert verdict.fence_violations == 0
    assert (verdict.stale_writes, verdict.stale_rejected) == (1, 1)


# --- each violation is caught ---


def test_overlap_within_validity_is_caught():
    a = section("a", 0, 0.0, 2.0)
    b = section("b", 0, 1.0, 3.0)
    found = overlaps([b, a])  # any order in, sorted inside
    assert found == [(a, b)]
    assert check([a, b], counter=2, accepted=[]).overlaps == 1


def test_a_section_nested_inside_a_long_one_is_caught_even_after_a_short_one():
    """The sweep keeps the stretch that ends last, not merely the previous one."""
    long = section("a", 0, 0.0, 10.0)
    short = section("b", 0, 0.5, 1.0)  # overlaps long
    later = section("c", 0, 5.0, 6.0)  # still inside long, though after short
    assert [pair[1] for pair in overlaps([long, short, later])] == [short, later]


def test_lost_update_is_caught_both_ways():
    history = serial(5)
    assert lost_updates(history, counter=5) == 0
    assert lost_updates(history, counter=4) == 1  # one write lost
    assert lost_updates(history, counter=6) == -1  # a write nobody recorded
    assert check(history, counter=4, accepted=[1, 2, 3, 4, 5]).violations == 1
    assert check(history, counter=6, accepted=[1, 2, 3, 4, 5]).violations == 1


def test_sections_that_did_not_write_are_not_expected_in_the_counter():
    history = serial(3) + [section("x", 9, 20.0, 21.0, counted=False, fence=99)]
    assert lost_updates(history, counter=3) == 0


def test_an_expired_handout_is_caught():
    bad = section("a", 0, 5.0, 5.1, valid_until=4.9)
    assert expired_handouts([bad]) == [bad]
    assert check([bad], counter=1, accepted=[]).expired_handouts == 1


def test_repeated_or_decreasing_fences_are_caught():
    history = [
        section("a", 0, 0.0, 1.0, fence=5),
        section("b", 0, 1.0, 2.0, fence=5),  # repeated
        section("c", 0, 2.0, 3.0, fence=7),
        section("d", 0, 3.0, 4.0, fence=6),  # decreasing
    ]
    pairs = fence_order_violations(history)
    assert [(a.fence, b.fence) for a, b in pairs] == [(5, 5), (7, 6)]


def test_fences_are_compared_in_acquisition_order_not_record_order():
    late, early = section("b", 0, 5.0, 6.0, fence=2), section("a", 0, 0.0, 1.0, fence=1)
    assert fence_order_violations([late, early]) == []


def test_sections_without_a_fence_are_skipped_by_the_fence_order():
    history = [section("a", 0, 0.0, 1.0, fence=1), section("b", 0, 1.0, 2.0, fence=None)]
    assert fence_order_violations(history) == []


def test_a_store_that_accepted_a_non_increasing_token_is_caught():
    assert accepted_order_violations([1, 2, 3]) == []
    assert accepted_order_violations([1, 3, 3, 2]) == [(3, 3), (3, 2)]
    assert check(serial(3), counter=3, accepted=[1, 3, 2]).fence_violations == 1


def test_a_write_rejected_within_validity_is_caught():
    """Rejected while still valid: someone with a token at least as high wrote during our
    lease, so two holders overlapped or a token repeated."""
    victim = section("a", 0, 0.0, 2.0, valid_until=5.0, fence=3, fenced=False, wrote_at=1.9)
    assert rejected_while_valid([victim]) == [victim]
    verdict = check([victim], counter=0, accepted=[])
    assert verdict.fence_violations == 1
    assert verdict.examples == ("valid write rejected: a#0 [0.0000, 2.0000] fence=3",)


def test_a_stale_write_that_was_accepted_is_counted_but_not_a_violation():
    """Late, but nobody newer had written: accepting it is what a max-register does."""
    late = section("a", 0, 0.0, 3.0, valid_until=1.0, fence=4, fenced=True, wrote_at=2.5)
    assert stale_writes([late]) == [late]
    verdict = check([late], counter=1, accepted=[4])
    assert (verdict.stale_writes, verdict.stale_rejected, verdict.violations) == (1, 0, 0)


def test_a_broken_history_trips_every_checker_at_once():
    """What a quorum of 1 produces: two holders at once, the same token, a lost update."""
    a = section("a", 0, 0.0, 1.0, fence=1, fenced=True, wrote_at=0.9)
    b = section("b", 0, 0.1, 1.1, fence=1, fenced=False, wrote_at=1.0)
    verdict = check([a, b], counter=1, accepted=[1])
    assert verdict.lost_updates == 1
    assert verdict.overlaps == 1
    assert verdict.fence_violations == 2  # repeated token, and b's valid write rejected
    assert verdict.violations == 4
    assert len(verdict.examples) == 3


# --- the sweep against brute force ---


intervals = st.lists(
    st.tuples(st.floats(0, 100), st.floats(0.001, 10), st.floats(0.001, 10)),
    min_size=0,
    max_size=12,
)


@given(intervals)
def test_the_sweep_finds_an_overlap_iff_some_pair_overlaps(spans):
    history = [
        section(str(i), i, start, start + held, valid_until=start + valid)
        for i, (start, held, valid) in enumerate(spans)
    ]
    brute = any(
        a.acquired < b.end and b.acquired < a.end
        for i, a in enumerate(history)
        for b in history[i + 1 :]
    )
    assert bool(overlaps(history)) == brute


@given(st.lists(st.floats(0.01, 5), min_size=1, max_size=20))
def test_back_to_back_sections_never_overlap(durations):
    history, now = [], 0.0
    for i, held in enumerate(durations):
        history.append(section(str(i), i, now, now + held, fence=i + 1))
        now += held
    assert (
        check(history, counter=len(history), accepted=list(range(1, len(history) + 1))).violations
        == 0
    )
