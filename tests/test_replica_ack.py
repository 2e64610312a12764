"""Replica acknowledgement per member (``?wait_replicas=1&wait_timeout=...``: ``engine.acks``), on
a real primary and its real replica (``django_redlock.testing.sentinels.primary_and_replica``,
started once for the module): a grant counts once the replica has it; with the replica stopped
(SIGSTOP) the member's vote fails, saying why, and what it wrote is cleaned up; bad options are
refused before any connection."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.core.checks import Error

from django_redlock import conf
from django_redlock.engine import LockLost, QuorumUnavailable, Redlock
from django_redlock.engine.members.acks import REASON
from django_redlock.testing.masters import free_port
from django_redlock.testing.sentinels import primary_and_replica
from tests.conftest import wait_until

#: WAIT's timeout, and the node budget it must fit in: generous, so that on a loaded machine
#: a member whose replica is stopped still answers (0/1) well within its budget.
WAIT_TIMEOUT = 0.15
NODE_TIMEOUT = 1.0


@pytest.fixture(scope="module")
def _pair(tmp_path_factory):
    with primary_and_replica(tmp_path_factory.mktemp("replicated"), lag=True) as started:
        yield started


@pytest.fixture
def pair(_pair):
    """The primary, its replica (in sync, empty, running) and the replication link's proxy."""
    primary, replica, link = _pair
    if replica.paused:
        replica.resume()
    link.delay = 0.0
    primary.call("FLUSHALL")
    offset = primary.call("INFO", "replication")["master_repl_offset"]
    caught_up = wait_until(
        lambda: replica.call("INFO", "replication").get("slave_repl_offset", -1) >= offset, 10
    )
    assert caught_up, "the replica did not catch up"
    return primary, replica, link


def acked(url: str, timeout: float = WAIT_TIMEOUT) -> str:
    return f"{url}?wait_replicas=1&wait_timeout={timeout}"


def key(resource: str) -> str:
    return f"redlock:lock:{resource}"


def test_a_grant_counts_once_the_replica_has_it_sync_and_async(pair, redlock_of):
    """Replication lags 0.3 s each way: with the option the lock is granted only once the
    replica has its key (so a failover right then keeps it); without, the replica lacks it."""
    primary, replica, link = pair
    link.delay = 0.3
    waiting = redlock_of([acked(primary.url, 1.0)], ttl=20, node_timeout=1.5)
    plain = redlock_of([primary.url], ttl=20, node_timeout=1.5)
    with waiting.lock("acked"):
        assert replica.call("EXISTS", key("acked")) == 1
    with plain.lock("plain"):  # the control: the replica has not got it yet
        assert replica.call("EXISTS", key("plain")) == 0

    async def extend_then_check() -> float:
        async with waiting.lock("acked-async", ttl=5) as lock:
            assert replica.call("EXISTS", key("acked-async")) == 1
            await lock.aextend(ttl=15)
            return replica.call("PTTL", key("acked-async")) / 1000

    # The extension too: the replica has the new TTL when extend() returns.
    assert asyncio.run(extend_then_check()) > 10


def test_with_the_replica_stopped_the_vote_fails_and_its_grant_is_cleaned_up(pair, redlock_of):
    primary, replica, _ = pair
    engine = redlock_of([acked(primary.url)], ttl=5, node_timeout=NODE_TIMEOUT)
    replica.pause()
    with pytest.raises(QuorumUnavailable) as failed:
        engine.lock("r").acquire()
    (failure,) = failed.value.failures
    assert (failure.reason, failure.detail) == (
        REASON,
        f"0/1 replicas acknowledged within {WAIT_TIMEOUT} s",
    )
    assert "replica ack (0/1" in str(failed.value)
    assert primary.call("EXISTS", key("r")) == 0  # the failed attempt's release cleaned it

    async def async_attempt() -> None:
        async with engine.lock("r-async"):
            pass

    with pytest.raises(QuorumUnavailable, match="replica ack"):
        asyncio.run(async_attempt())
    assert primary.call("EXISTS", key("r-async")) == 0


def test_an_extension_the_replica_did_not_acknowledge_does_not_count(pair, redlock_of):
    primary, replica, _ = pair
    engine = redlock_of([acked(primary.url)], ttl=1.5, node_timeout=0.7)
    lock = engine.lock("x")
    lock.acquire()
    replica.pause()
    with pytest.raises(LockLost, match="replica ack"):
        lock.extend()


def test_on_three_members_the_acknowledging_one_decides_when_it_is_needed(
    pair, masters, redlock_of
):
    primary, replica, _ = pair
    others = masters[:2]
    engine = redlock_of(
        [acked(primary.url), *(m.url for m in others)], ttl=5, node_timeout=NODE_TIMEOUT
    )
    others[1].pause()  # the replicated member's vote is needed for a quorum of 2
    with engine.lock("q"):
        assert replica.call("EXISTS", key("q")) == 1
    replica.pause()
    with pytest.raises(QuorumUnavailable) as failed:
        engine.lock("q").acquire()
    reasons = sorted(f.reason for f in failed.value.failures)
    assert reasons == [REASON, "timeout"]
    assert (primary.call("EXISTS", key("q")), others[0].call("EXISTS", key("q"))) == (0, 0)
    replica.resume()  # it votes again, once it has sat out acks.SIT_OUT (1 s)
    assert wait_until(lambda: _acquired_and_released(engine, "q"), 5.0)


def _acquired_and_released(engine: Redlock, resource: str) -> bool:
    try:
        with engine.lock(resource):
            return True
    except QuorumUnavailable:
        return False


def test_after_a_missed_acknowledgement_the_member_sits_out_grants_for_a_while(pair, redlock_of):
    """Each grant there would hold its connection for wait_timeout while its replica is missing:
    for acks.SIT_OUT it is not asked for grants (a failed vote saying so); releases still go."""
    primary, replica, _ = pair
    engine = redlock_of([acked(primary.url)], ttl=5, node_timeout=NODE_TIMEOUT)
    replica.pause()
    with pytest.raises(QuorumUnavailable, match=r"replica ack \(0/1"):
        engine.lock("s").acquire()
    waits = primary.call("INFO", "commandstats").get("cmdstat_wait", {}).get("calls", 0)
    with pytest.raises(QuorumUnavailable, match=r"replica ack \(not asked") as again:
        engine.lock("s").acquire()
    assert "asked again in" in str(again.value)
    assert primary.call("INFO", "commandstats")["cmdstat_wait"]["calls"] == waits
    assert primary.call("EXISTS", key("s")) == 0


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ("wait_replicas=1", "wait_timeout is missing"),
        ("wait_timeout=0.01", "wait_replicas is missing"),
        ("wait_replicas=0&wait_timeout=0.01", "got '0'"),
        ("wait_replicas=one&wait_timeout=0.01", "got 'one'"),
        ("wait_replicas=1&wait_timeout=0", "got '0'"),
        ("wait_replicas=1&wait_timeout=-1", "got '-1'"),
        ("wait_replicas=1&wait_timeout=nan", "got 'nan'"),
        ("wait_replicas=1&wait_timeout=soon", "got 'soon'"),
        ("wait_replicas=1&wait_timeout=0.05", "wait_timeout=0.05 does not fit"),
        ("wait_replicas=1&wait_timeout=0.2", "wait_timeout=0.2 does not fit"),
    ],
)
def test_bad_options_are_refused_before_any_connection(options, named):
    url = f"redis://:secret@127.0.0.1:{free_port()}/0?{options}"  # nothing listens there
    with pytest.raises(ValueError, match=named) as refused:
        Redlock([url], ttl=5, node_timeout=0.05)
    assert "secret" not in str(refused.value)


def test_the_system_checks_name_the_member_and_its_timeout(settings):
    port = free_port()
    member = f"redis://127.0.0.1:{port}/0?wait_replicas=1&wait_timeout=0.05"
    settings.REDLOCK = {"NODES": [member], "NODE_TIMEOUT": 0.05}
    reported = [p for p in conf.problems() if p.is_error]
    assert [(p.id, p.message) for p in reported] == [
        (
            "E009",
            f"REDLOCK['NODES'] entry: node {member!r}: wait_timeout=0.05 does not fit in the "
            f"per-node budget node_timeout=0.05: a member whose replicas are down would answer "
            f"after its budget (use a wait_timeout well under it, half or less)",
        )
    ]
    settings.REDLOCK = {"NODES": [member.replace("=0.05", "=zero")]}
    (bad,) = [p for p in conf.problems() if p.is_error]
    assert (bad.id, "'zero'" in bad.message) == ("E003", True)
    settings.REDLOCK = {"NODES": [member.replace("=0.05", "=0.02")], "NODE_TIMEOUT": 0.05}
    assert not any(isinstance(m, Error) for m in _checks())


def _checks():
    from django_redlock.checks import check_settings

    return check_settings()


def test_an_acl_without_wait_makes_a_failed_vote_that_says_so(pair, redlock_of):
    """The lock's ACL user needs ``+wait`` on such a member: without it, WAIT's refusal is the
    member's answer (a failed vote naming it), never a grant."""
    from tests.test_security import LOCKER_RULES

    primary, _, _ = pair
    url = acked(f"redis://locker:pw@127.0.0.1:{primary.port}/0")
    primary.call("ACL", "SETUSER", "locker", *LOCKER_RULES)
    try:
        with pytest.raises(QuorumUnavailable, match=r"error \(NoPermissionError.*wait"):
            redlock_of([url], ttl=5, node_timeout=NODE_TIMEOUT).lock("acl").acquire()
        primary.call("ACL", "SETUSER", "locker", "+wait")
        with redlock_of([url], ttl=5, node_timeout=NODE_TIMEOUT).lock("acl"):
            pass
    finally:
        primary.call("ACL", "DELUSER", "locker")


def test_an_unacknowledged_vote_is_counted_in_the_node_failures_metric(pair, settings):
    from django_redlock import redlock
    from tests.test_quarantine import metric_value

    primary, replica, _ = pair
    settings.REDLOCK = {"NODES": [acked(primary.url)], "NODE_TIMEOUT": NODE_TIMEOUT}
    before = metric_value(REASON)
    replica.pause()
    with pytest.raises(QuorumUnavailable), redlock("metered"):
        pass
    assert metric_value(REASON) == before + 1


def test_a_missed_acknowledgement_the_round_did_not_wait_for_still_counts(
    pair, masters, redlock_of
):
    """On three members the round returns at quorum without the one whose replica is stopped;
    its WAIT's answer, read later, still makes it sit out: no request piles up behind WAITs."""
    primary, replica, _ = pair
    engine = redlock_of(
        [acked(primary.url), *(m.url for m in masters[:2])], ttl=5, node_timeout=NODE_TIMEOUT
    )
    with engine.lock("warm"):  # connected, scripts loaded
        pass
    replica.pause()
    with engine.lock("u"):  # won at quorum by the other two
        pass

    def waits() -> int:
        return primary.call("INFO", "commandstats").get("cmdstat_wait", {}).get("calls", 0)

    time.sleep(WAIT_TIMEOUT + 0.2)  # its WAIT answered meanwhile: read by the next round
    with engine.lock("u"):
        pass
    assert engine.nodes[0].acks.until > 0
    before = waits()
    for _ in range(5):
        with engine.lock("u"):
            pass
    assert waits() == before


def test_a_cluster_member_cannot_take_the_option_yet():
    url = f"redis+cluster://127.0.0.1:{free_port()}/?wait_replicas=1&wait_timeout=0.01"
    with pytest.raises(ValueError, match="wait_replicas is not supported on a redis\\+cluster"):
        Redlock([url], ttl=5, node_timeout=0.05)
