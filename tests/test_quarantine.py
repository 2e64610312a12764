"""Restart and failover quarantine (the "delayed restarts" rule, done in the client): a member
that restarted, failed over, or has been up less than MAX_TTL abstains from votes, on real
redis-server processes and real restarts."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from prometheus_client import REGISTRY

from django_redlock import conf
from django_redlock.engine import QuorumUnavailable, Redlock
from django_redlock.engine.members.quarantine import Identity, Watch, parse_info
from django_redlock.signals import masters_failed

MAX_TTL = 1.0


def wait_uptime(masters, seconds: float) -> None:
    """Until every master has been up ``seconds`` (INFO's whole seconds)."""
    deadline = time.monotonic() + seconds + 5
    for m in masters:
        while m.client().info("server")["uptime_in_seconds"] < seconds:
            assert time.monotonic() < deadline, f"{m} never reached {seconds} s of uptime"
            time.sleep(0.05)


def metric_value(reason: str) -> float:
    labels = {"reason": reason}
    return sum(
        s.value
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name == "redlock_node_failures_total" and labels.items() <= s.labels.items()
    )


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
    assert "restarted or failed over (new replication id)" in str(refused.value)
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
        (identity(), identity(replid="s"), 10, "restarted or failed over (new replication id)"),
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


def test_a_promoted_primary_abstains_at_first_sight_only_where_promotion_is_distrusted():
    promoted = Identity("a", "r", "master", 100.0, promoted=True)
    plain, shard = Watch(10.0), Watch(10.0, distrust_promotion=True)
    for watch in (plain, shard):
        watch.judge(promoted, now=100.0)
    assert plain.until == 0.0  # a plain member keeps its address: a failover changes its replid
    assert (shard.until, shard.reason.startswith("promoted from a replica")) == (110.0, True)
    again = Watch(10.0, distrust_promotion=True)
    again.judge(identity(), now=0.0)
    again.judge(promoted, now=100.0)  # seen before: only a change of identity counts then
    assert again.until == 0.0


def test_info_is_parsed():
    text = (
        b"# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\nuptime_in_seconds:42\r\n\r\n"
        b"# Replication\r\nrole:master\r\nmaster_replid:def\r\n"
    )
    assert parse_info(text) == Identity("abc", "def", "master", 42.0)
    assert parse_info(text + b"second_repl_offset:-1\r\n").promoted is False
    assert parse_info(text + b"second_repl_offset:1234\r\n").promoted is True
    with pytest.raises(ValueError, match="identity field"):
        parse_info(b"# Server\r\nrun_id:abc\r\n")


# --- the Django layer: settings, checks, status, signals, metrics ---


def test_settings_checks_name_a_quarantine_without_max_ttl_and_a_ttl_over_it(settings, masters):
    urls = [m.url for m in masters[:3]]
    settings.REDLOCK = {"NODES": urls, "QUARANTINE": True}
    assert [(p.id, p.message) for p in conf.problems()] == [
        ("E007", "REDLOCK['QUARANTINE'] needs REDLOCK['MAX_TTL']: how long a member that may "
                 "have lost keys must abstain"),
    ]  # fmt: skip
    settings.REDLOCK = {"NODES": urls, "QUARANTINE": True, "MAX_TTL": 10}
    assert [(p.id, p.message) for p in conf.problems()] == [
        ("E005", "REDLOCK['TTL'] (30.0) is over REDLOCK['MAX_TTL'] (10)"),
    ]
    settings.REDLOCK = {"NODES": urls, "QUARANTINE": "yes", "MAX_TTL": -1, "TTL": 5}
    assert sorted(p.message for p in conf.problems()) == [
        "REDLOCK['MAX_TTL'] must be > 0 seconds, got -1",
        "REDLOCK['QUARANTINE'] must be True or False, got 'yes'",
    ]
    settings.REDLOCK = {"NODES": urls, "QUARANTINE": True, "MAX_TTL": 60, "TTL": 5}
    assert conf.problems() == []
    engine = conf.get_redlock()
    assert (engine.max_ttl, engine.quarantine) == (60.0, True)
    with pytest.raises(ValueError, match="over max_ttl"):
        engine.lock("long", ttl=61)


def test_abstentions_reach_masters_failed_the_status_command_and_metrics(settings, fresh_masters):
    masters = fresh_masters(3)
    wait_uptime(masters, 2)  # (2 s of abstention after the restart: time enough to look)
    settings.REDLOCK = {
        "NODES": [m.url for m in masters], "TTL": 2, "MAX_TTL": 2, "QUARANTINE": True,
    }  # fmt: skip
    engine = conf.get_redlock()
    with engine.lock("warm"):
        pass
    masters[2].restart()
    heard = []

    def receiver(sender, *, lock, action, failures, **kwargs):
        heard.extend((action, f.reason) for f in failures)

    before = metric_value("quarantine")
    masters_failed.connect(receiver)
    try:
        with engine.lock("after-restart"):
            pass
    finally:
        masters_failed.disconnect(receiver)
    assert ("acquire", "quarantine") in heard
    out = StringIO()
    with pytest.raises(CommandError, match="DEGRADED"):  # 2 voting of 3, quorum 2
        call_command("redlock_status", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["abstaining"] == 1
    assert [bool(m["abstains"]) for m in data["masters"]] == [False, False, True]
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("redlock_status", stdout=out)
    assert "(1 abstaining)" in out.getvalue()
    assert "quarantine: restarted or failed over (new replication id and run_id)" in out.getvalue()
    # One per action the abstaining master failed (the acquisition, the release): as heard.
    assert metric_value("quarantine") == before + len(heard) >= before + 1


def test_async_rounds_see_the_same_abstentions(fresh_masters, redlock_of):
    """A loop's pipe is opened in our connect threads: its identity is read there too."""
    masters = fresh_masters(3)
    engine = redlock_of(masters, ttl=2, max_ttl=2, quarantine=True)
    with pytest.raises(QuorumUnavailable) as refused:
        asyncio.run(engine.lock("fresh-async").aacquire())
    assert reasons(refused.value) == ["quarantine"] * 3
    assert lock_keys(masters, "fresh-async") == [False] * 3
