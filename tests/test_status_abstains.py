"""``redlock_status`` counts what the engine counts: a member that cannot vote (its replica
acknowledgement cannot be had) or abstains after a failover (seen from a process that did not
watch it happen) is abstaining, on real replicas and a real Sentinel failover."""

from __future__ import annotations

from django_redlock.engine import Redlock
from django_redlock.operations.health import DEGRADED, probe_all
from django_redlock.testing.sentinels import primary_and_replica, sentinel_group
from tests.conftest import wait_until


def uptime(server) -> int:
    return int(server.call("INFO", "server")["uptime_in_seconds"])


def test_a_member_whose_replica_is_down_is_counted_as_not_voting(tmp_path, fresh_masters):
    others = fresh_masters(2)
    with primary_and_replica(tmp_path) as (primary, replica, _):
        url = f"{primary.url}?wait_replicas=1&wait_timeout=0.1"
        engine = Redlock([url, *(m.url for m in others)], node_timeout=0.5)
        try:
            # (A replica just started is still syncing, and then acknowledges once a second:
            # until it has, the member cannot vote, and the status says so.)
            assert wait_until(lambda: probe_all(engine).abstaining == 0, 15), probe_all(engine)
            replica.stop()
            assert wait_until(
                lambda: primary.call("INFO", "replication")["connected_slaves"] == 0, 10
            )
            health = probe_all(engine)
            assert health.abstaining == 1, health.nodes
            assert health.verdict == DEGRADED, health.summary
            assert "replica ack" in (health.nodes[0].abstains or ""), health.nodes[0]
        finally:
            engine.close()


def test_a_paused_replica_stops_acknowledging_and_the_status_says_so(tmp_path, fresh_masters):
    others = fresh_masters(2)
    with primary_and_replica(tmp_path) as (primary, replica, _):
        url = f"{primary.url}?wait_replicas=1&wait_timeout=0.1"
        engine = Redlock([url, *(m.url for m in others)], node_timeout=0.5)
        replica.pause()
        try:
            # (Replicas acknowledge every second: a paused one's lag grows past acks.ACK_LAG.)
            assert wait_until(lambda: probe_all(engine).abstaining == 1, 15), "never counted"
        finally:
            replica.resume()
            engine.close()


def test_a_failover_is_counted_by_a_status_that_did_not_watch_it(tmp_path, fresh_masters):
    """After a real Sentinel failover, a fresh engine (what cron's status command has) sees a
    primary that is up longer than MAX_TTL: only its promotion says the application abstains.
    Once a replica (the old primary, which Sentinel makes one some seconds later) has followed
    it for MAX_TTL, the failover is older than that: it votes again."""
    max_ttl = 4.0
    others = fresh_masters(2)
    with sentinel_group(tmp_path) as group:
        assert wait_until(lambda: uptime(group.replica) >= max_ttl, 20), "replica too young"
        urls = [group.url, *(m.url for m in others)]
        group.failover()
        status = Redlock(urls, ttl=2, max_ttl=max_ttl, quarantine=True)
        try:
            health = probe_all(status)
            assert health.abstaining == 1, health.nodes
            assert "promoted" in (health.nodes[0].abstains or ""), health.nodes[0]
            assert health.verdict == DEGRADED, health.summary
            # (Sentinel demotes the old primary some 8-10 s after the switch.)
            assert wait_until(lambda: probe_all(status).abstaining == 0, max_ttl + 40, step=0.5)
        finally:
            status.close()
