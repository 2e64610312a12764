"""Restart and failover quarantine (the "delayed restarts" rule, done in the client): a member
that restarted, failed over, or has been up less than MAX_TTL abstains from votes, on real
redis-server processes and real restarts."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from django_redlock.engine import QuorumUnavailable, Redlock
from django_redlock.engine.quarantine import Identity, Watch, parse_info

MAX_TTL = 1.0


def wait_uptime(masters, seconds: float) -> None:
    """Until every master has been up ``seconds`` (INFO's whole seconds)."""
    deadline = time.monotonic() + seconds + 5
    for m in masters:
        while m.client().info("server")["uptime_in_seconds"] < seconds:
            assert time.monotonic() < deadline, f"{m} never reached {seconds} s of uptime"
            time.sleep(0.05)


def lock_keys(masters, resource: str) -> list[bool]:
    return [bool(m.call("EXISTS", f"redlock:lock:{resource}")) for m in masters]


def reasons(error: BaseException) -> list[str]:
    return sorted(f.reason for f in error.failures)  # type: ignore[attr-defined]


def test_freshly_started_members_abstain_until_up_max_ttl_and_their_keys_are_still_cleaned(
    fresh_masters, redlock_of
):
    masters = fresh_masters(3)
    engine = redlock_of(masters, ttl=2, max_ttl=2, quarantine=True)
    with pytest.raises(QuorumUnavailable) as refused:
        engine.lock("fresh").acquire()
    assert reasons(refused.value) == ["quarantine"] * 3
    assert "up only" in str(refused.value)
    # Each abstaining member granted the SET (its answer did not count): the failed attempt's
    # clean-up reached every one of them.
    assert lock_keys(masters, "fresh") == [False] * 3
    # (INFO's uptime is whole seconds, rounded down: the abstention can end up to 1 s late.)
    time.sleep(max(node.watch.until for node in engine.nodes) - time.monotonic() + 0.01)
    with engine.lock("fresh"):
        assert lock_keys(masters, "fresh") == [True] * 3


def test_quarantine_is_off_by_default_and_fresh_members_vote(fresh_masters, redlock_of):
    masters = fresh_masters(3)
    with redlock_of(masters).lock("fresh"):
        assert lock_keys(masters, "fresh") == [True] * 3


def test_a_majority_restarted_empty_under_a_holder_cannot_grant_the_lock_again(
    fresh_masters, redlock_of
):
    """The restart-empty hazard, on 3 members: the holder's copies on 2 of them vanish with a
    restart; without quarantine a second client wins them (two holders); with it, the restarted
    members abstain, both for the holder's engine (it saw their run_id change) and for a new one
    (it sees their uptime)."""
    masters = fresh_masters(3)
    wait_uptime(masters, MAX_TTL)
    options = {"ttl": MAX_TTL, "max_ttl": MAX_TTL, "quarantine": True}
    holder_engine, other_engine = redlock_of(masters, **options), redlock_of(masters, **options)
    unguarded = redlock_of(masters, ttl=MAX_TTL)
    holder = holder_engine.lock("hazard")
    holder.acquire()
    masters[0].restart()
    masters[1].restart()
    for engine in (holder_engine, other_engine):
        with ThreadPoolExecutor(1) as other_thread:  # (this thread would re-enter its own lock)
            attempt = other_thread.submit(engine.lock("hazard").acquire)
            with pytest.raises(QuorumUnavailable) as refused:
                attempt.result()
        assert reasons(refused.value).count("quarantine") == 2, refused.value
    # The same moment without quarantine: the hazard (a second holder while the first holds).
    second = unguarded.lock("hazard")
    second.acquire()
    assert holder.validity > 0
    second.release()


def test_a_promoted_replica_abstains_for_max_ttl(fresh_masters, redlock_of):
    """A member demoted to a replica, then promoted (as a failover does): its uptime is long but
    its replication id is new. It abstains for MAX_TTL, then votes again."""
    masters = fresh_masters(3)
    wait_uptime(masters, MAX_TTL)
    engine = redlock_of(masters, ttl=MAX_TTL, max_ttl=MAX_TTL, quarantine=True)
    with engine.lock("before"):  # identities read on connect
        pass
    target = masters[1]
    target.call("REPLICAOF", "127.0.0.1", str(masters[2].port))
    target.call("REPLICAOF", "NO", "ONE")
    target.call("CLIENT", "KILL", "TYPE", "normal")  # as Sentinel does after a failover
    masters[0].kill()  # members 1 and 2 left: member 1's vote is needed
    with pytest.raises(QuorumUnavailable) as refused:
        engine.lock("after").acquire()
    assert "failed over (new replication id)" in str(refused.value)
    time.sleep(MAX_TTL + 0.1)
    with engine.lock("after"):
        pass


def test_a_ttl_over_max_ttl_is_refused_before_any_network_call():
    # Unreachable members: a network call would fail differently (and slowly).
    engine = Redlock(["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"],
                     ttl=5, max_ttl=10, quarantine=True)  # fmt: skip
    with pytest.raises(ValueError, match=r"ttl 11 is over max_ttl=10"):
        engine.lock("x", ttl=11)
    with pytest.raises(ValueError, match=r"ttl 30.0 is over max_ttl=10"):
        Redlock(["redis://127.0.0.1:1"], max_ttl=10)
    with pytest.raises(ValueError, match="quarantine needs max_ttl"):
        Redlock(["redis://127.0.0.1:1"], quarantine=True)
    engine.close()


def identity(run_id="a", replid="r", role="master", uptime=100.0) -> Identity:
    return Identity(run_id, replid, role, uptime)


@pytest.mark.parametrize(
    ("before", "after", "abstains_for", "reason"),
    [
        (None, identity(uptime=3), 7, "up only 3 s"),
        (None, identity(), 0, ""),
        (identity(), identity(run_id="b"), 10, "restarted"),
        (identity(), identity(replid="s"), 10, "failed over"),
        (identity(), identity(role="slave"), 10, "not a primary"),
    ],
)
def test_the_rule(before, after, abstains_for, reason):
    watch = Watch(10.0)
    if before is not None:
        watch.judge(before, now=0.0)
    watch.judge(after, now=100.0)
    assert watch.until == (100.0 + abstains_for if abstains_for else 0.0)
    assert watch.reason.startswith(reason)


def test_info_is_parsed():
    text = (
        b"# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\nuptime_in_seconds:42\r\n\r\n"
        b"# Replication\r\nrole:master\r\nmaster_replid:def\r\n"
    )
    assert parse_info(text) == Identity("abc", "def", "master", 42.0)
    with pytest.raises(ValueError, match="identity field"):
        parse_info(b"# Server\r\nrun_id:abc\r\n")
