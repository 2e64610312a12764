"""A member that is a Sentinel-managed primary (``redis+sentinel://``), on real Sentinels
(``django_redlock.testing.sentinels``): it locks on the primary, follows a real failover, and
with quarantine on the promoted replica abstains for MAX_TTL."""

from __future__ import annotations

import time

import pytest

from django_redlock.engine import QuorumUnavailable, Redlock
from django_redlock.testing.masters import free_port
from django_redlock.testing.sentinels import sentinel_group


@pytest.fixture
def group(tmp_path):
    with sentinel_group(tmp_path / "sentinels") as started:
        yield started


def key(resource: str) -> str:
    return f"redlock:lock:{resource}"


def test_a_sentinel_member_locks_on_the_primary_and_follows_a_failover(
    group, fresh_masters, redlock_of
):
    others = fresh_masters(2)
    # A dead Sentinel listed first: the next one answers.
    dead = free_port()
    url = group.url.replace("redis+sentinel://", f"redis+sentinel://127.0.0.1:{dead},")
    engine = redlock_of([url, *others], ttl=5)
    old = group.primary
    with engine.lock("before"):
        assert old.call("EXISTS", key("before")) == 1
    new = group.failover()
    assert new is not old
    # Sentinel closed our connection to the old primary (or it answers READONLY): the next
    # round's new connection asks Sentinel again, and finds the new primary.
    others[0].kill()  # the Sentinel member's vote is now needed
    deadline = time.monotonic() + 5
    while True:
        try:
            with engine.lock("after"):
                assert new.call("EXISTS", key("after")) == 1
            break
        except QuorumUnavailable:
            # (at most one round: the old primary's READONLY closes our pipe to it)
            assert time.monotonic() < deadline
    assert new.call("EXISTS", key("after")) == 0  # released there


def test_with_quarantine_the_promoted_replica_abstains(group, fresh_masters, redlock_of):
    others = fresh_masters(2)
    max_ttl = 1.0
    while min(m.call("INFO", "server")["uptime_in_seconds"] for m in others) < max_ttl:
        time.sleep(0.05)
    engine = redlock_of([group.url, *others], ttl=max_ttl, max_ttl=max_ttl, quarantine=True)
    with engine.lock("before"):
        pass
    group.failover()
    others[0].kill()
    deadline = time.monotonic() + max_ttl
    reasons = []
    while not reasons and time.monotonic() < deadline:
        with pytest.raises(QuorumUnavailable) as refused:
            engine.lock("after").acquire()
        reasons = [f.detail for f in refused.value.failures if f.reason == "quarantine"]
    assert reasons, refused.value
    assert "new replication id" in reasons[0]
    time.sleep(max_ttl + 0.1)
    with engine.lock("after"):
        assert group.primary.call("EXISTS", key("after")) == 1


def test_two_entries_for_one_sentinel_service_are_one_member():
    with pytest.raises(ValueError, match="nodes listed more than once"):
        Redlock([
            "redis+sentinel://127.0.0.1:26379,localhost:26380/mymaster/0",
            "redis+sentinel://localhost:26380,127.0.0.1:26379/mymaster/1",
            "redis://127.0.0.1:6379/0",
        ])  # fmt: skip


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://127.0.0.1:26379/", "names no Sentinel service"),
        ("redis+sentinel://127.0.0.1:26379", "names no Sentinel service"),
        ("redis+cluster://127.0.0.1:7000/", "is not a redis://, rediss://, unix:// or redis+s"),
        ("redis+sentinel+cluster://h:1/m", "is not a redis://"),
        ("redis+sentinel://:secret@127.0.0.1:x/m", "bad Sentinel address"),
        ("redis+sentinel://127.0.0.1:26379/m/x", "db that is not a number"),
    ],
)
def test_bad_sentinel_urls_are_refused_before_any_network_call(url, message):
    with pytest.raises(ValueError, match=message) as refused:
        Redlock([url])
    assert "secret" not in str(refused.value)
