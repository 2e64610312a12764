"""A member that is a Redis Cluster (``redis+cluster://``), on a real three-shard cluster
(``django_redlock.testing.clusters``), started once for the module: one vote routed by hash slot
to the shard that owns the key, MOVED after a real slot migration, ASK during one, a killed
shard, multi-resource locks in one slot, fencing tokens, notices, the inventory and the status
probe across shards, quarantine per shard."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from io import StringIO

import pytest
from django.core.checks import WARNING
from django.core.management import call_command
from redis.crc import key_slot

from django_redlock import conf, force_release, health, inventory, redlock
from django_redlock.checks import check_clusters_reachable, check_settings
from django_redlock.engine import LockLost, LockNotAcquired, Redlock
from django_redlock.engine.cluster import SlotMap
from django_redlock.engine.shards import ClusterMember
from django_redlock.signals import masters_failed
from django_redlock.testing.clusters import LocalCluster, local_cluster
from django_redlock.testing.masters import free_port

from .conftest import hand_off_time
from .test_security import LOCKER_RULES, make_certificates, no_tls, tls_missing

CLUSTER_RULES = ["+cluster|slots", "+asking", "+command"]

#: Each master's budget per request: generous, so that a loaded machine fails no vote.
BUDGET = 0.5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """One cluster for the module, also on TLS ports when the redis-server can (Debian's can)."""
    workdir = tmp_path_factory.mktemp("cluster")
    tls = None if tls_missing() else make_certificates(workdir / "certs", "cluster")
    with local_cluster(workdir, tls=tls) as started:
        yield started


@pytest.fixture(scope="module")
def replicated_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A cluster whose first primary has a replica, for failover (its own: a failover changes
    it for good)."""
    with local_cluster(tmp_path_factory.mktemp("replicated"), replicas=1) as started:
        yield started


def uptime(shard) -> float:
    return float(shard.call("INFO", "server")["uptime_in_seconds"])


def role(shard) -> str:
    return str(shard.call("INFO", "replication")["role"])


def poll(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def key(resource: str) -> str:
    return f"redlock:lock:{resource}"


def tag_on(cluster: LocalCluster, shard, prefix: str) -> str:
    """A resource ``{<prefix>N}`` whose keys live on ``shard`` now."""
    for n in range(1000):
        resource = f"{{{prefix}{n}}}"
        if cluster.owner(key(resource)) is shard:
            return resource
    raise LookupError(f"no tag of {prefix!r} on {shard}")


def decisive(cluster: LocalCluster, masters) -> list[str]:
    """Three members, one of them dead: no lock without the cluster's vote."""
    return [cluster.url, masters[0].url, f"redis://127.0.0.1:{free_port()}/0"]


def member(engine: Redlock) -> ClusterMember:
    node = engine.nodes[0]
    assert isinstance(node, ClusterMember)
    return node


def test_the_cluster_votes_through_the_shard_that_owns_each_key(cluster, masters, redlock_of):
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET)
    for shard in cluster.shards:
        resource = tag_on(cluster, shard, "vote")
        with engine.lock(resource):
            assert cluster.where(key(resource)) == [shard]
        assert cluster.where(key(resource)) == []  # released there
    # One pipe per shard, made by the rounds: the member's own is never used.
    assert member(engine).pipe is None
    assert len([s for s in member(engine).shards if s.pipe is not None]) == 3


def test_an_event_loop_routes_by_slot_too(cluster, masters, redlock_of):
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET)
    resources = [tag_on(cluster, shard, "loop") for shard in cluster.shards]

    async def scenario() -> list[int]:
        held = []
        for resource in resources:
            async with engine.lock(resource):
                held.append(len(cluster.where(key(resource))))
        return held

    assert asyncio.run(scenario()) == [1, 1, 1]


def test_moved_after_a_real_slot_migration_is_followed(cluster, masters, redlock_of):
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET)
    source, target = cluster.shards[0], cluster.shards[1]
    resource = tag_on(cluster, source, "moved")
    slot = key_slot(key(resource).encode())
    member(engine).refresh()
    assert member(engine).map.owner(slot) == ("127.0.0.1", source.port)
    cluster.migrate_slot(slot, to=target)
    # Our map still says the source: it answers MOVED, and the request goes to the target.
    with engine.lock(resource):
        assert cluster.where(key(resource)) == [target]
    assert member(engine).map.owner(slot) == ("127.0.0.1", target.port)
    assert cluster.where(key(resource)) == []


def test_ask_during_a_migration_is_followed_and_leaves_the_map(cluster, masters, redlock_of):
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET)
    source, target = cluster.shards[2], cluster.shards[0]
    resource = tag_on(cluster, source, "ask")
    slot = key_slot(key(resource).encode())
    member(engine).refresh()
    cluster.start_migration(slot, to=target)
    try:
        # The source has no such key: it answers ASK, and ASKING + the request go to the target.
        lock = engine.lock(resource).acquire()
        assert cluster.where(key(resource)) == [target]
        assert member(engine).map.owner(slot) == ("127.0.0.1", source.port)
    finally:
        cluster.finish_migration(slot, source, target)
    # (Released after the migration: during it, the target answers a script over several keys
    # some of which it lacks with TRYAGAIN, a failed vote.) The source now answers MOVED.
    lock.release()
    assert cluster.where(key(resource)) == []
    assert member(engine).map.owner(slot) == ("127.0.0.1", target.port)


def tryagain_count(shard) -> int:
    stats = shard.call("INFO", "errorstats")
    return int(stats.get("errorstat_TRYAGAIN", {}).get("count", 0))


def test_tryagain_during_a_migration_is_a_second_try_on_the_same_shard(
    cluster, masters, redlock_of
):
    # Two resources of one slot under migration, neither key anywhere yet: the source answers
    # ASK (it lacks them), the target (ASKING, importing) TRYAGAIN (it lacks some keys of a
    # multi-key request). That is "the migration is moving these keys: ask again in a moment".
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET)
    source, target = cluster.shards[0], cluster.shards[2]
    resources = (tag_on(cluster, source, "tryagain") + ":a",)
    resources += (resources[0][:-2] + ":b",)
    slot = key_slot(key(resources[0]).encode())
    member(engine).refresh()
    cluster.start_migration(slot, to=target)
    try:
        before = tryagain_count(target)
        with pytest.raises(LockNotAcquired) as caught:  # (still migrating: TRYAGAIN again)
            engine.lock(*resources).acquire()
        # The attempt and the release that undoes it: each asked, then asked once more.
        assert tryagain_count(target) - before == 2 * 2
        failures = caught.value.failures
        assert any("TryAgainError" in f.detail for f in failures), failures
    finally:
        cluster.finish_migration(slot, source, target)
    with engine.lock(*resources):
        assert cluster.where(key(resources[1])) == [target]


def test_a_release_decided_before_the_cluster_answered_still_follows_its_moved(
    cluster, masters, redlock_of
):
    # Two plain masters release at once; the cluster's old owner of the slot answers MOVED only
    # after a pause. The round is decided by the plain masters, but the release must still
    # reach the new owner, or its key stays there for the whole TTL.
    engine = redlock_of([cluster.url, masters[0].url, masters[1].url], ttl=5, node_timeout=BUDGET)
    shards = cluster.shards
    for attempt, (source, target) in enumerate([(shards[0], shards[1]), (shards[1], shards[2])]):
        resource = tag_on(cluster, source, f"release{attempt}-")
        slot = key_slot(key(resource).encode())
        member(engine).refresh()
        lock = engine.lock(resource).acquire()
        cluster.migrate_slot(slot, to=target)  # our map still names the source
        source.call("CLIENT", "PAUSE", 200)  # its MOVED comes 200 ms after the others' answers
        lock.release()
        assert cluster.where(key(resource)) == [], f"attempt {attempt}: the release was dropped"


def test_a_release_to_a_silent_shard_still_follows_its_moved(cluster, masters, redlock_of):
    # The old owner of the slot let a request go unanswered for its whole budget (paused): it
    # is "silent", and rounds told such a master their request without waiting. Its MOVED was
    # then read by no one: the release never reached the new owner.
    engine = redlock_of([cluster.url, masters[0].url, masters[1].url], ttl=5, node_timeout=BUDGET)
    source, target = cluster.shards[2], cluster.shards[1]
    resource, other = tag_on(cluster, source, "silent"), tag_on(cluster, source, "other")
    slot = key_slot(key(resource).encode())
    member(engine).refresh()
    lock = engine.lock(resource).acquire()
    cluster.migrate_slot(slot, to=target)  # our map still names the source
    source.call("CLIENT", "PAUSE", int((BUDGET + 0.2) * 1000))
    engine.holder(other)  # no answer from the source within its budget (a plain one: silent)
    lock.release()  # the source answers MOVED 200 ms later, within the release's budget
    assert cluster.where(key(resource)) == []


def test_a_map_entry_for_a_gone_primary_is_read_again_after_the_failed_connect(
    cluster, masters, redlock_of
):
    """As after a failover inside the cluster: our map names an address that no longer serves
    the slot (nothing answers there, so no MOVED will come). The failed connect has the map read
    again, and the next attempt goes to the slot's real owner."""
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET, retry_delay=0.2)
    resource = tag_on(cluster, cluster.shards[1], "gone")
    slot = key_slot(key(resource).encode())
    member(engine).refresh()
    member(engine).map.moved(slot, ("127.0.0.1", free_port()))  # stale: nothing listens there
    with engine.lock(resource, wait=3):
        assert cluster.where(key(resource)) == [cluster.shards[1]]
    assert member(engine).map.owner(slot) == ("127.0.0.1", cluster.shards[1].port)


def test_a_script_the_ask_target_forgot_is_sent_again_after_asking(cluster, masters, redlock_of):
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET)
    source, target = cluster.shards[1], cluster.shards[2]
    resource = tag_on(cluster, source, "forgot")
    assert engine.holder(tag_on(cluster, target, "warm")) is None  # PEEK known to the target
    target.call("SCRIPT", "FLUSH")  # ... which then forgets it
    slot = key_slot(key(resource).encode())
    member(engine).refresh()
    cluster.start_migration(slot, to=target)
    try:
        lock = engine.lock(resource).acquire()  # a SET, through ASK: the key is on the target
        # PEEK: the source answers ASK; the target NOSCRIPT; then ASKING + the script's source.
        held = engine.holder(resource)
        assert held is not None
        assert held.masters == 2
    finally:
        cluster.finish_migration(slot, source, target)
    lock.release()


def test_a_child_forked_while_a_shard_was_being_made_can_make_shards(cluster, redlock_of):
    # A thread of the parent held the member's guard of its shard nodes when the process forked:
    # that thread does not run in the child, so the child must not inherit the guard held.
    engine = redlock_of([cluster.url], ttl=5, node_timeout=BUDGET)
    node = member(engine)
    resource = tag_on(cluster, cluster.shards[2], "forked")
    with node._shards_guard:  # noqa: SLF001 (as the parent's thread making a shard node)
        pid = os.fork()
        if pid == 0:  # the child: a new shard node and a lock, then leave without cleanup
            code = 1
            try:
                node.shard(("127.0.0.1", free_port()))
                with engine.lock(resource):
                    code = 0
            finally:
                os._exit(code)
    deadline = time.monotonic() + 20.0
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on the shard guard it inherited held")
    assert os.waitstatus_to_exitcode(done[1]) == 0


def test_a_slot_map_is_learnt_range_by_range(cluster):
    reply = cluster.shards[0].call("CLUSTER", "SLOTS")
    learnt = SlotMap()
    learnt.learn(reply)
    for start, end, primary, *_ in reply:  # type: ignore[attr-defined]
        for slot in (int(start), (int(start) + int(end)) // 2, int(end)):
            assert learnt.owner(slot) == ("127.0.0.1", int(primary[1]))
    assert sum(learnt.owner(slot) is None for slot in range(16384)) == 0


def test_one_lock_over_several_resources_needs_one_hash_tag(cluster, masters, redlock_of):
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET)
    with engine.lock("{order:7}:payment", "{order:7}:stock"):
        shard = cluster.owner(key("{order:7}:payment"))
        assert cluster.where(key("{order:7}:payment")) == cluster.where(key("{order:7}:stock"))
        assert cluster.where(key("{order:7}:stock")) == [shard]
    # A name without a tag is spelled {name} in its keys: "order:7" shares the slot of order 7.
    with engine.lock("{order:7}:payment", "order:7"):
        assert cluster.where(key("{order:7}")) == [shard]
    assert cluster.keys("redlock:lock:*") == []
    # Resources in different slots: refused before any request, the reason named.
    assert key_slot(key("{a}").encode()) != key_slot(key("{b}").encode())
    with pytest.raises(ValueError, match=r"resources '\{a\}' .*'\{b\}' .*have different hash tags"):
        engine.lock("{a}", "{b}")
    with pytest.raises(ValueError, match=r"resources 'a' \(\{a\}\), 'b' \(\{b\}\) have different"):
        engine.lock("a", "b")


def _acquire_and_release(lock) -> int:
    with lock:
        return lock.fence


def all_keys_in_one_slot(cluster: LocalCluster, name: str) -> set[int]:
    """The hash slots of every key on the cluster now that belongs to ``name`` (any kind)."""
    spelled = f"{{{name}}}"
    found = [k.decode() for k in cluster.keys("redlock:*") if spelled in k.decode()]
    assert found, f"no key of {name!r} on the cluster"
    return {key_slot(k.encode()) for k in found}


def test_names_without_a_hash_tag_lock_wait_fence_share_and_count_permits(cluster, redlock_of):
    """Was refused: every name had to carry a hand-written {...}. Now the engine tags its own
    keys: lock, fence counter, waiters' queue, readers set and markers, permit slots all hash to
    the name's one slot (the cluster decides alone: a CROSSSLOT would fail every vote)."""
    engine = redlock_of([cluster.url], ttl=5, node_timeout=BUDGET)
    other = redlock_of([cluster.url], ttl=5, node_timeout=BUDGET, retry_delay=5.0)
    with engine.lock("invoice:42") as lock:
        assert lock.key == "redlock:lock:{invoice:42}"
        assert lock.fence >= 1
        # A waiter queues (its queue key) and is woken by the release's notice.
        waiting = ThreadPoolExecutor(1)
        waited = waiting.submit(_acquire_and_release, other.lock("invoice:42", wait=4))
        poll(lambda: cluster.keys("redlock:queue:*") != [], "the waiter queued")
        assert len(all_keys_in_one_slot(cluster, "invoice:42")) == 1
    assert waited.result(timeout=10) >= 1  # its fence: it got the lock
    waiting.shutdown()
    # "name" and "{name}" are one lock here (as a hand-tagged name was before).
    with engine.lock("{invoice:42}"), pytest.raises(LockNotAcquired):
        other.lock("invoice:42").acquire()

    readers = [engine.lock("report", shared=True).acquire() for _ in range(2)]
    assert len(all_keys_in_one_slot(cluster, "report")) == 1
    with pytest.raises(LockNotAcquired):
        other.lock("report").acquire()  # the writer is refused while they read
    seen = engine.holder("report")
    assert seen is not None
    assert len(seen.holders) == 2
    for reader in readers:
        reader.release()

    # limit= (refused before): the slots live in the name's slot too.
    permits = [e.lock("seats", limit=2).acquire() for e in (engine, other)]
    assert len(all_keys_in_one_slot(cluster, "seats")) == 1
    assert {p.slot for p in permits} == {0, 1}
    third = redlock_of([cluster.url], ttl=5, node_timeout=BUDGET)
    with pytest.raises(LockNotAcquired):
        third.lock("seats", limit=2).acquire()
    held = engine.holder("seats")
    assert held is not None
    assert len(held.holders) == 2
    for permit in permits:
        permit.release()
    with third.lock("seats", limit=2):
        pass
    # (The semaphore's marker outlives its permits by their TTL; no slot is left.)
    assert cluster.keys("redlock:lock:*") == [b"redlock:lock:{seats}"]


def test_keys_of_a_redlock_without_a_cluster_member_are_as_written(masters, redlock_of):
    engine = redlock_of(masters, ttl=5)
    assert engine.lock_key("invoice:42") == "redlock:lock:invoice:42"
    assert engine.key("lock", "seats", "#1") == "redlock:lock:seats#1"
    assert engine.fence_key("{a}b") == "redlock:fence:{a}b"


def test_redlock_on_a_cluster_tags_untagged_names_and_refuses_two_slots_before_any_request(
    settings,
):
    """Through Django's ``redlock()`` as through ``Redlock.lock``: both ways ``redlock()``
    makes a lock (the first lock of a set of options made in full, the next ones from the
    options kept: ``locks.plain``). Before any request: the member's address has no server."""
    nowhere = f"redis+cluster://127.0.0.1:{free_port()}/"
    settings.REDLOCK = {"NODES": [nowhere], "TTL": 5, "NODE_TIMEOUT": BUDGET}
    for _ in range(2):  # made in full, then from the kept options
        assert redlock("{order:1}:payment").key == "redlock:lock:{order:1}:payment"
        assert redlock("invoice:1").key == "redlock:lock:{invoice:1}"
        assert redlock("a}b").key == "redlock:lock:{a}b}"
        with pytest.raises(ValueError, match=r"resources '\{a\}' .*'\{b\}' .*different hash tags"):
            redlock("{a}", "{b}")
    assert redlock("pool", limit=2).key == "redlock:lock:{pool}#permits"
    assert redlock("report", shared=True).key == "redlock:lock:{report}@readers"
    assert redlock("nightly", auto_extend=True).key == "redlock:lock:{nightly}"


def test_readers_keep_their_keys_in_the_names_slot(cluster, redlock_of):
    engine = redlock_of([cluster.url], ttl=5, node_timeout=BUDGET)  # the cluster decides alone
    readers = [engine.lock("{doc}", shared=True).acquire() for _ in range(2)]
    with pytest.raises(LockNotAcquired):
        engine.lock("{doc}").acquire()  # the writer waits for the readers
    for reader in readers:
        reader.release()
    with engine.lock("{doc}"):
        pass


def test_fencing_tokens_increase_per_resource_across_shards_and_a_migration(cluster, redlock_of):
    engine = redlock_of(
        [cluster.url], ttl=5, node_timeout=BUDGET
    )  # the cluster alone: its counters decide
    resources = [tag_on(cluster, shard, "fence") for shard in cluster.shards]
    tokens: dict[str, list[int]] = {r: [] for r in resources}
    for _ in range(2):
        for resource in resources:
            with engine.lock(resource) as lock:
                tokens[resource].append(lock.fence)
    moved = resources[0]
    slot = key_slot(key(moved).encode())
    cluster.migrate_slot(slot, to=cluster.shards[1])  # the fence key goes with its slot
    with engine.lock(moved) as lock:
        tokens[moved].append(lock.fence)
    for resource, seen in tokens.items():
        assert seen == sorted(set(seen)), f"{resource}: {seen}"
    assert tokens[moved][-1] > tokens[moved][-2]


def test_a_waiter_is_woken_by_a_notice_published_on_the_cluster(cluster, redlock_of):
    # The cluster is the only member and polls are 5 s apart: only its notice wakes the waiter.
    engine = redlock_of([cluster.url], ttl=5, retry_delay=5.0, node_timeout=BUDGET)
    assert hand_off_time(engine, "{notice}") < 1.0


def test_inventory_and_status_cover_every_shard(cluster, masters, redlock_of):
    engine = redlock_of([cluster.url, masters[0].url, masters[1].url], ttl=5, node_timeout=BUDGET)
    resources = sorted(tag_on(cluster, shard, "inv") for shard in cluster.shards)
    held = [engine.lock(resource).acquire() for resource in resources]
    try:
        listed = inventory.list_locks(engine, timeout=5)
        assert [lock.resource for lock in listed.locks] == resources
        assert all(len(lock.copies) == 3 for lock in listed.locks)
        assert listed.failures == ()
    finally:
        for lock in held:
            lock.release()
    probed = health.probe_all(engine, timeout=5).nodes[0]
    assert probed.reachable
    assert probed.node == member(engine).label
    shard_labels = {f"shard 127.0.0.1:{s.port}" for s in cluster.shards}
    named = {w.split(": ", 1)[0].rpartition(" shard ")[2] for w in probed.warnings}
    assert {f"shard {n}" for n in named} == shard_labels


def test_redlock_status_lists_the_locks_held_on_every_shard(settings, cluster, masters):
    settings.REDLOCK = {
        "NODES": [cluster.url, masters[0].url, masters[1].url],
        "TTL": 5,
        "NODE_TIMEOUT": BUDGET,
    }
    engine = conf.get_redlock()
    resources = sorted(tag_on(cluster, shard, "status") for shard in cluster.shards)
    held = [engine.lock(resource).acquire() for resource in resources]
    try:
        out = StringIO()
        call_command("redlock_status", "--wide", stdout=out)
    finally:
        for lock in held:
            lock.release()
    text = out.getvalue()
    assert "3 of 3 masters reachable, quorum 2: OK" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    for resource in resources:
        assert "3/3" in lines[resource], text


#: The ``locker`` user of docs/deployment.md, and what a Cluster member needs besides: the slot
#: map (CLUSTER SLOTS), ASKING, and COMMAND (redis-py's RedisCluster, which the inventory and
#: the release notices use, reads the command table when it starts).
CLUSTER_LOCKER_RULES = [*LOCKER_RULES, *CLUSTER_RULES]


def test_an_acl_user_limited_to_the_prefix_locks_waits_and_lists_on_a_cluster(
    cluster, masters, redlock_of
):
    for shard in cluster.shards:
        shard.call("ACL", "SETUSER", "locker", *CLUSTER_LOCKER_RULES)
    try:
        url = cluster.url.replace("redis+cluster://", "redis+cluster://locker:pw@")
        engine = redlock_of(
            [url, masters[0].url, f"redis://127.0.0.1:{free_port()}/0"],
            ttl=5,
            node_timeout=BUDGET,
            retry_delay=5.0,
        )
        resources = sorted(tag_on(cluster, shard, "acl") for shard in cluster.shards)
        held = [engine.lock(resource).acquire() for resource in resources]
        try:
            listed = inventory.list_locks(engine, timeout=5)
            assert [lock.resource for lock in listed.locks] == resources
        finally:
            for lock in held:
                lock.release()
        slot = key_slot(key(resources[0]).encode())
        owner = cluster.owner(key(resources[0]))
        target = next(s for s in cluster.shards if s is not owner)
        cluster.start_migration(slot, to=target)
        try:
            lock = engine.lock(resources[0]).acquire()  # ASK: ASKING is allowed
        finally:
            cluster.finish_migration(slot, owner, target)
        lock.release()  # MOVED
        # Only a notice wakes the waiter before the 5 s retry: SUBSCRIBE through the cluster.
        assert hand_off_time(engine, "{acl-wait}") < 1.0
        wrong = redlock_of([url.replace(":pw@", ":nope@")], ttl=5, node_timeout=BUDGET)
        with pytest.raises(LockNotAcquired) as caught:
            wrong.lock("{acl-wait}").acquire()
        assert "WRONGPASS" in str(caught.value) or "AuthenticationError" in str(caught.value)
        assert ":nope@" not in str(caught.value)
    finally:
        for shard in cluster.shards:
            shard.call("ACL", "DELUSER", "locker")


def test_a_tls_cluster_member_locks_follows_moved_and_lists(cluster, masters, redlock_of):
    if cluster.tls_url is None:
        no_tls(tls_missing() or "the cluster started without TLS")
    engine = redlock_of(
        [cluster.tls_url, masters[0].url, f"redis://127.0.0.1:{free_port()}/0"],
        ttl=5,
        node_timeout=BUDGET,
    )
    resources = sorted(tag_on(cluster, shard, "tls") for shard in cluster.shards)
    held = [engine.lock(resource).acquire() for resource in resources]
    try:
        assert [
            lock.resource for lock in inventory.list_locks(engine, timeout=5).locks
        ] == resources
    finally:
        for lock in held:
            lock.release()
    member(engine).refresh()  # CLUSTER SLOTS over TLS names the TLS ports
    assert {port for _, port in member(engine).map.primaries()} == {
        s.tls_port for s in cluster.shards
    }
    slot = key_slot(key(resources[0]).encode())
    owner = cluster.owner(key(resources[0]))
    target = next(s for s in cluster.shards if s is not owner)
    cluster.migrate_slot(slot, to=target)
    with engine.lock(resources[0]):  # MOVED names the target's TLS port
        assert cluster.where(key(resources[0])) == [target]
    assert member(engine).map.owner(slot) == ("127.0.0.1", target.tls_port)


def test_quarantine_watches_each_shard(cluster, masters, redlock_of):
    # The shards have been up for seconds, under max_ttl: each abstains, named.
    engine = redlock_of(
        decisive(cluster, masters), ttl=5, max_ttl=600, quarantine=True, node_timeout=BUDGET
    )
    resource = tag_on(cluster, cluster.shards[1], "quarantine")
    with pytest.raises(LockNotAcquired) as caught:
        engine.lock(resource).acquire()
    reasons = {(f.node, f.reason) for f in caught.value.failures}
    assert (f"{member(engine).label} shard 127.0.0.1:{cluster.shards[1].port}", "quarantine") in (
        reasons
    )


def test_a_replica_promoted_inside_the_cluster_abstains_at_first_sight(
    replicated_cluster, masters, redlock_of
):
    # A cluster failover gives the member a new address for the slot's owner: a first sight,
    # where only uptime was checked. The promoted replica has been up longer than max_ttl, yet
    # may lack the newest lock keys: it must abstain, for having been promoted.
    cluster = replicated_cluster
    primary, replica = cluster.shards[0], cluster.replicas[0]
    max_ttl = 3.0
    poll(lambda: min(uptime(replica), uptime(primary)) >= max_ttl + 0.5, "shards up > max_ttl")
    engine = redlock_of(
        decisive(cluster, masters),
        ttl=max_ttl,
        max_ttl=max_ttl,
        quarantine=True,
        node_timeout=BUDGET,
    )
    resource = tag_on(cluster, primary, "promoted")
    with engine.lock(resource, wait=10):  # (waits out the plain master's quarantine, if any)
        pass
    replica.call("CLUSTER", "FAILOVER", "TAKEOVER")
    poll(lambda: (role(replica), role(primary)) == ("master", "slave"), "the failover")
    with pytest.raises(LockNotAcquired) as caught:
        engine.lock(resource).acquire()  # MOVED from the demoted primary to the promoted one
    reasons = {(f.node, f.reason) for f in caught.value.failures}
    shard = f"{member(engine).label} shard 127.0.0.1:{replica.port}"
    assert (shard, "quarantine") in reasons, caught.value.failures


def test_a_killed_shard_fails_the_vote_for_its_slots_only(settings, cluster, masters, redlock_of):
    """Last in this module: it kills a shard (and brings it back)."""
    engine = redlock_of(decisive(cluster, masters), ttl=5, node_timeout=BUDGET)
    dead, alive = cluster.shards[2], cluster.shards[0]
    lost, kept = tag_on(cluster, dead, "kill"), tag_on(cluster, alive, "kill")
    member(engine).refresh()
    dead.kill()
    try:
        with pytest.raises(LockNotAcquired) as caught:
            engine.lock(lost).acquire()
        failed = {f.node: f.detail for f in caught.value.failures}
        shard = f"{member(engine).label} shard 127.0.0.1:{dead.port}"
        assert "ConnectionError" in failed[shard], failed
        with engine.lock(kept):
            assert cluster.where(key(kept)) == [alive]
        # Through Django: masters_failed names the shard (the lock is won on the two masters).
        settings.REDLOCK = {
            "NODES": [cluster.url, masters[0].url, masters[1].url],
            "TTL": 5,
            "NODE_TIMEOUT": BUDGET,
        }
        heard = []

        def receiver(sender, *, lock, action, failures, **kwargs):
            heard.extend((action, f.node, f.reason) for f in failures)

        masters_failed.connect(receiver)
        try:
            with conf.get_redlock().lock(lost):
                pass
        finally:
            masters_failed.disconnect(receiver)
        assert ("acquire", shard, "error") in heard
        probed = health.probe_all(engine, timeout=5).nodes[0]
        assert not probed.reachable
        assert f"127.0.0.1:{dead.port}" in (probed.error or "")
    finally:
        dead.start()
        cluster.wait_ok()


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://127.0.0.1:7000,/", "empty cluster node address"),
        ("redis+cluster://127.0.0.1:7000/3", "only db 0"),
        ("rediss+cluster://user:secret@127.0.0.1:port/", "bad cluster node address"),
        ("redis+cluster://:7000/", "without a host"),
    ],
)
def test_a_bad_cluster_url_is_refused_before_any_connection(url, why):
    with pytest.raises(ValueError, match=why) as caught:
        Redlock([url])
    assert "secret" not in str(caught.value)


def test_two_entries_naming_one_cluster_are_one_member_twice():
    one = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/"
    for other in (
        "redis+cluster://localhost:7001,127.0.0.1:7000/",  # the same seeds, reordered
        "redis+cluster://127.0.0.1:7001,127.0.0.1:7002/",  # a seed in common
        "redis://127.0.0.1:7000/0",  # a plain entry for one of its shards
    ):
        with pytest.raises(ValueError, match="listed more than once"):
            Redlock([one, other, "redis://127.0.0.1:6390/0"])
    with pytest.raises(ValueError, match="key_prefix '\\{app\\}:' must not contain"):
        Redlock([one], key_prefix="{app}:")


def test_a_cluster_whose_seeds_do_not_answer_is_a_deploy_warning(settings, cluster, masters):
    dead = f"redis+cluster://u:secret@127.0.0.1:{free_port()}/"
    # (QUARANTINE on: without it W003 would warn about every Cluster member)
    quarantined = {"QUARANTINE": True, "MAX_TTL": 30}
    settings.REDLOCK = {"NODES": [dead, masters[0].url, masters[1].url], **quarantined}
    # Not in the checks every command runs (no network; a cluster down must not stop migrate).
    assert [m.id for m in check_settings()] == []
    call_command("check", stdout=StringIO(), stderr=StringIO())  # no SystemCheckError
    reported = check_clusters_reachable()
    assert [(m.id, m.level) for m in reported] == [("django_redlock.W004", WARNING)]
    assert "redis+cluster://u:***@127.0.0.1" in reported[0].msg
    assert "no seed of this Redis Cluster told its slot map" in reported[0].msg
    out, err = StringIO(), StringIO()
    call_command("check", deploy=True, stdout=out, stderr=err)  # a warning: it does not fail
    assert "django_redlock.W004" in out.getvalue() + err.getvalue()
    settings.REDLOCK = {"NODES": [cluster.url, masters[0].url, masters[1].url], **quarantined}
    assert check_clusters_reachable() == []
    assert [m.id for m in check_settings()] == []
    settings.REDLOCK = {
        "NODES": [cluster.url, cluster.url.replace("127.0.0.1", "localhost"), masters[0].url],
        **quarantined,
    }
    assert [m.id for m in check_settings()] == ["django_redlock.E004"]


def test_a_permit_moved_by_a_slot_migration_is_never_granted_twice(cluster, redlock_of):
    """A semaphore's scripts read its slots by names they build (undeclared keys). During a slot
    migration a permit key already moved to the target is not on the source: the source must
    not take it for free. Redis refuses a script's access to such a key ("non local key"), and
    a request whose declared keys are split answers ASK or TRYAGAIN: failed votes, never a
    second grant of the moved permit."""
    engines = [redlock_of([cluster.url], ttl=10, node_timeout=BUDGET) for _ in range(3)]
    source, target = cluster.shards[1], cluster.shards[2]
    name = next(f"pool{n}" for n in range(1000) if cluster.owner(key(f"{{pool{n}}}")) is source)
    held = engines[0].lock(name, limit=2).acquire()
    slot_key = f"redlock:slot:{{{name}}}#{held.slot}"
    slot = key_slot(slot_key.encode())
    cluster.start_migration(slot, to=target)
    try:
        # (With tls-cluster, as Debian's redis-server runs this module's cluster, MIGRATE speaks
        # TLS: to the target's TLS port, as the harness's finish_migration does.)
        port = target.tls_port or target.port
        source.call("MIGRATE", "127.0.0.1", port, "", 0, 5000, "KEYS", slot_key)
        assert cluster.where(slot_key) == [target]
        taken_locks = []
        for engine in engines[1:]:
            with contextlib.suppress(LockNotAcquired):
                taken_locks.append(engine.lock(name, limit=2).acquire())
        taken = [lock.slot for lock in taken_locks]
        assert held.slot not in taken, taken  # the moved permit, granted again: two holders
        assert len(taken) <= 1, taken  # never more permits than the limit
    finally:
        cluster.finish_migration(slot, source, target)
    for lock in taken_locks:
        lock.release()
    # After it: the held permit is on the target, with the slot; the other one is free.
    with engines[1].lock(name, limit=2) as other:
        assert other.slot != held.slot
        with pytest.raises(LockNotAcquired):
            engines[2].lock(name, limit=2).acquire()
    held.release()


def test_the_inventory_lists_and_releases_a_name_the_engine_tagged(cluster, masters, redlock_of):
    engine = redlock_of(decisive(cluster, masters), ttl=10, node_timeout=BUDGET)
    lock = engine.lock("ledger:1").acquire()
    listed = inventory.list_locks(engine, timeout=5)
    assert "{ledger:1}" in [held.resource for held in listed.locks]  # as its keys spell it
    shown = inventory.inspect(engine, "ledger:1")  # by the name as the code writes it
    assert shown is not None
    assert len(shown.copies) == 2
    released = force_release.force_release(engine, "ledger:1", shown.fingerprint)
    assert "released on 2 of 3 masters" in released.describe()
    assert cluster.where(key("{ledger:1}")) == []
    with pytest.raises(LockLost):
        lock.release()
