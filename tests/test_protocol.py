"""Property tests of the pure Redlock core (``engine/base/protocol.py``): no I/O, no clock."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from django_redlock.engine.base import protocol
from django_redlock.engine.base.protocol import MAX_RESOURCE_LENGTH, Vote

node_counts = st.integers(min_value=1, max_value=99)
ttls = st.floats(min_value=0.01, max_value=3600, allow_nan=False)
elapsed_times = st.floats(min_value=0, max_value=3600, allow_nan=False)
drift_factors = st.floats(min_value=0, max_value=0.99, allow_nan=False)


# --- quorum --------------------------------------------------------------------------------------


@given(node_counts)
def test_quorum_is_integer_majority(n):
    q = protocol.quorum(n)
    assert isinstance(q, int)
    assert q == n // 2 + 1
    assert q > n / 2  # a strict majority...
    assert q - 1 <= n / 2  # ...and the smallest one


@given(st.data(), node_counts)
def test_two_quorums_always_share_a_master(data, n):
    q = protocol.quorum(n)
    masters = list(range(n))
    first = data.draw(st.sets(st.sampled_from(masters), min_size=q))
    second = data.draw(st.sets(st.sampled_from(masters), min_size=q))
    assert first & second


@pytest.mark.parametrize("n", [0, -1])
def test_quorum_of_no_masters_is_an_error(n):
    with pytest.raises(ValueError, match=str(n)):
        protocol.quorum(n)


# --- tally ---------------------------------------------------------------------------------------


@given(
    st.lists(st.sampled_from(list(Vote)), min_size=1, max_size=15),
    ttls,
    elapsed_times,
    drift_factors,
)
def test_tally_verdicts_are_consistent(votes, ttl, elapsed, factor):
    t = protocol.tally(votes, ttl=ttl, elapsed=elapsed, drift_factor=factor)
    n = len(votes)
    assert (t.granted, t.denied, t.failed) == (
        votes.count(Vote.GRANTED),
        votes.count(Vote.DENIED),
        votes.count(Vote.FAILED),
    )
    assert t.total == n
    assert t.quorum == n // 2 + 1
    assert t.validity == protocol.validity(ttl, elapsed, factor)
    assert t.won == (t.granted >= t.quorum and t.validity > 0)
    # A quorum that granted also answered.
    if t.granted >= t.quorum:
        assert t.contended
    # Not contended means too many failed for a quorum to be possible at all.
    assert t.contended == (t.failed <= n - t.quorum)
    # Lost: the denials alone rule out a granting quorum, whatever the failed masters say.
    assert t.lost == (t.granted + t.failed < t.quorum)
    assert not (t.lost and t.won)
    if not t.contended:
        assert not t.won


def test_tally_examples():
    g, d, f = Vote.GRANTED, Vote.DENIED, Vote.FAILED
    won = protocol.tally([g, g, g, d, f], ttl=10, elapsed=0.01, drift_factor=0.01)
    assert (won.won, won.contended, won.lost) == (True, True, False)
    late = protocol.tally([g, g, g, g, g], ttl=1, elapsed=1, drift_factor=0.01)
    assert (late.won, late.contended, late.lost) == (False, True, False)
    assert late.validity < 0
    held = protocol.tally([g, g, d, d, d], ttl=10, elapsed=0.01, drift_factor=0.01)
    assert (held.won, held.contended, held.lost) == (False, True, True)
    down = protocol.tally([g, g, f, f, f], ttl=10, elapsed=0.01, drift_factor=0.01)
    assert (down.won, down.contended, down.lost) == (False, False, False)


# --- validity and drift --------------------------------------------------------------------------


@given(ttls, elapsed_times, elapsed_times, drift_factors)
def test_validity_decreases_with_elapsed(ttl, e1, e2, factor):
    assume(e1 < e2)
    assert protocol.validity(ttl, e1, factor) >= protocol.validity(ttl, e2, factor)
    assume(e2 - e1 > 1e-6 * max(1, ttl, e2))  # beyond float rounding
    assert protocol.validity(ttl, e1, factor) > protocol.validity(ttl, e2, factor)


@given(ttls, elapsed_times, drift_factors, drift_factors)
def test_validity_decreases_with_drift(ttl, elapsed, f1, f2):
    assume(f1 < f2)
    assert protocol.validity(ttl, elapsed, f1) >= protocol.validity(ttl, elapsed, f2)


@given(ttls, drift_factors)
def test_validity_is_below_ttl_even_with_no_time_spent(ttl, factor):
    # The fixed drift floor keeps a margin for Redis' 1 ms expiry granularity.
    assert protocol.drift(ttl, factor) >= protocol.DRIFT_FLOOR
    assert protocol.validity(ttl, 0, factor) < ttl


def test_drift_formula():
    assert protocol.drift(10, 0.01) == pytest.approx(0.1 + 0.002)
    assert protocol.validity(10, 0.5, 0.01) == pytest.approx(10 - 0.5 - 0.102)


# --- retry jitter --------------------------------------------------------------------------------


@given(st.floats(min_value=1e-6, max_value=60, allow_nan=False), st.integers())
def test_retry_delay_is_within_half_and_full_base(base, seed):
    delay = protocol.retry_delay(base, random.Random(seed))
    assert base / 2 <= delay <= base


def test_retry_delay_is_random():
    rng = random.Random(7)
    delays = {protocol.retry_delay(1.0, rng) for _ in range(50)}
    assert len(delays) > 40


# --- fence merge ---------------------------------------------------------------------------------


@given(st.lists(st.one_of(st.none(), st.integers(min_value=0, max_value=2**62)), min_size=1))
def test_fence_merge_needs_a_quorum_and_goes_past_the_max(counters):
    n = len(counters)
    answered = [c for c in counters if c is not None]
    merged = protocol.fence_merge(counters, n)
    if len(answered) < n // 2 + 1:
        assert merged is None
    else:
        assert merged == max(answered) + 1


def test_fence_merge_examples():
    assert protocol.fence_merge([3, None, 7, 5, None], 5) == 8
    assert protocol.fence_merge([3, None, None, 5, None], 5) is None
    assert protocol.fence_merge([0], 1) == 1


# --- input checks --------------------------------------------------------------------------------

BAD_SECONDS = [True, False, math.nan, math.inf, -math.inf, "1", "", None, [1], b"1"]


@pytest.mark.parametrize("value", BAD_SECONDS + [0, 0.0, -1, -0.5, 0.001, 0.0099])
def test_check_ttl_rejects(value):
    with pytest.raises(ValueError, match=r"^ttl .*got ") as caught:
        protocol.check_ttl(value)
    assert repr(value) in str(caught.value)


YEAR = protocol.MAX_SECONDS


@given(st.floats(min_value=0.01, max_value=YEAR) | st.integers(min_value=1, max_value=int(YEAR)))
def test_check_ttl_accepts_positive_finite_numbers(value):
    assert protocol.check_ttl(value) == float(value)
    assert type(protocol.check_ttl(value)) is float


@pytest.mark.parametrize("value", BAD_SECONDS + [-1, -0.001])
def test_check_seconds_rejects(value):
    with pytest.raises(ValueError, match=r"^wait .*got ") as caught:
        protocol.check_seconds("wait", value, allow_zero=True)
    assert repr(value) in str(caught.value)


def test_check_seconds_zero_only_when_allowed():
    assert protocol.check_seconds("wait", 0, allow_zero=True) == 0.0
    with pytest.raises(ValueError, match=r"node_timeout must be > 0 seconds, got 0"):
        protocol.check_seconds("node_timeout", 0, allow_zero=False)


@given(st.floats(min_value=0, max_value=YEAR) | st.integers(min_value=0, max_value=int(YEAR)))
def test_check_seconds_accepts_non_negative_finite_numbers(value):
    assert protocol.check_seconds("wait", value, allow_zero=True) == float(value)


@given(
    st.floats(min_value=YEAR, exclude_min=True, allow_infinity=False)
    | st.integers(min_value=int(YEAR) + 1)
)
def test_more_than_a_year_is_refused(value):
    """Redis would refuse a PX past a signed 64-bit millisecond count (ttl=1e17 made every SET
    fail, reported as QuorumUnavailable); a year is far below that, and far above a lease."""
    with pytest.raises(ValueError, match=r"must be at most 31536000 seconds \(a year\)"):
        protocol.check_seconds("wait", value, allow_zero=True)


def test_an_int_too_large_for_a_float_is_a_value_error_not_an_overflow():
    with pytest.raises(ValueError, match="wait must be finite"):
        protocol.check_seconds("wait", 10**400, allow_zero=True)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must not be empty"),
        (None, "must be a str, got NoneType None"),
        (42, "must be a str, got int 42"),
        (b"x", "must be a str, got bytes b'x'"),
        (["x"], "must be a str, got list"),
        ("x" * (MAX_RESOURCE_LENGTH + 1), f"{MAX_RESOURCE_LENGTH + 1} characters long"),
    ],
)
def test_check_resource_rejects(value, message):
    with pytest.raises(ValueError, match=message):
        protocol.check_resource(value)


@given(st.text(min_size=1, max_size=MAX_RESOURCE_LENGTH))
def test_check_resource_accepts_bounded_text(value):
    assert protocol.check_resource(value) is value
