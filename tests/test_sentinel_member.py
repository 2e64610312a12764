"""A member that is a Sentinel-managed primary (``redis+sentinel://``), on real Sentinels
(``django_redlock.testing.sentinels``): it locks on the primary, follows a real failover (threads
and event loops), and with quarantine on a promoted replica that missed a lock abstains."""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from django_redlock.engine import LockNotAcquired, Redlock
from django_redlock.engine.members.rounds import SKIP_SILENT_FOR
from django_redlock.testing.masters import free_port
from django_redlock.testing.proxy import DelayProxy
from django_redlock.testing.sentinels import sentinel_group


@pytest.fixture
def group(tmp_path):
    with sentinel_group(tmp_path / "sentinels") as started:
        yield started


def wait_for(condition, what: str, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.02)


def switch_listeners(group) -> int:
    """Clients subscribed on the Sentinel our listener tries first (Sentinel has no PUBSUB)."""
    clients = group.sentinels[0].call("CLIENT", "LIST").decode().splitlines()
    return sum(" sub=1 " in line for line in clients)


def key(resource: str) -> str:
    return f"redlock:lock:{resource}"


def test_a_sentinel_member_locks_on_the_primary_and_follows_a_failover(
    group, fresh_masters, redlock_of
):
    others = fresh_masters(2)
    # A dead Sentinel listed first: the next one answers.
    dead = free_port()
    url = group.url.replace("redis+sentinel://", f"redis+sentinel://127.0.0.1:{dead},")
    # (A budget for a loaded machine: the member's first connect asks a dead Sentinel first.)
    engine = redlock_of([url, *others], ttl=5, node_timeout=0.5)
    old = group.primary
    with engine.lock("before"):
        # The round returned at quorum: the primary may apply our SET just after.
        wait_for(lambda: old.call("EXISTS", key("before")) == 1, "our key on the primary")
    wait_for(lambda: switch_listeners(group) == 1, "our +switch-master listener")
    pipe = engine.nodes[0].pipe
    new = group.failover()  # returns at +switch-master: the old primary still takes writes
    assert new is not old
    # +switch-master closed our connection to the old primary (it would take our writes for
    # seconds more): the next round's new connection asks Sentinel, and finds the new primary.
    wait_for(lambda: pipe.closed, "our pipe to the old primary closed")
    others[0].kill()  # the Sentinel member's vote is now needed
    with engine.lock("after"):
        assert (new.call("EXISTS", key("after")), old.call("EXISTS", key("after"))) == (1, 0)
    assert new.call("EXISTS", key("after")) == 0  # released there


def test_an_event_loops_pipe_follows_the_failover_too(group, fresh_masters, redlock_of):
    """+switch-master closes a loop's pipe on its own loop (told from the listener's thread)."""
    others = fresh_masters(2)
    engine = redlock_of([group.url, *others], ttl=5)
    old = group.primary

    async def scenario() -> tuple[int, int]:
        async with engine.lock("before"):
            pass
        pipe = engine.nodes[0].loop_pipe(asyncio.get_running_loop())
        assert pipe is not None
        await asyncio.to_thread(wait_for, lambda: switch_listeners(group) == 1, "listener")
        new = await asyncio.to_thread(group.failover)
        deadline = time.monotonic() + 3
        while not pipe.closed:
            assert time.monotonic() < deadline, "the loop's pipe to the old primary stayed open"
            await asyncio.sleep(0.02)
        others[0].kill()
        async with engine.lock("after"):
            return new.call("EXISTS", key("after")), old.call("EXISTS", key("after"))

    assert asyncio.run(scenario()) == (1, 0)


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
        ("redis+cluster://127.0.0.1:7000/9", "a Redis Cluster has only db 0"),
        ("redis+sentinel+cluster://h:1/m", "is not a redis://"),
        ("redis+sentinel://:secret@127.0.0.1:x/m", "bad Sentinel address"),
        ("redis+sentinel://127.0.0.1:26379/m/x", "db that is not a number"),
    ],
)
def test_bad_sentinel_urls_are_refused_before_any_network_call(url, message):
    with pytest.raises(ValueError, match=re.escape(message)) as refused:
        Redlock([url])
    assert "secret" not in str(refused.value)


@pytest.mark.parametrize("quarantine", [False, True], ids=["without-quarantine", "quarantine"])
def test_a_failover_that_lost_a_bare_quorum_lock(tmp_path, fresh_masters, redlock_of, quarantine):
    """A holder wins a bare quorum (plain member A and the Sentinel member's primary; plain
    member B is cut off and misses it); the replica lags (asynchronous replication) and is
    promoted. Without quarantine a contender then wins B and the promoted replica: two holders.
    With it, the promoted replica (a new replication id) abstains, and the contender is
    refused."""
    max_ttl = 2.0
    a, b = fresh_masters(2)
    with sentinel_group(tmp_path / "lagging", lag=True) as lagging, DelayProxy(b.port) as cut:
        for server in (a, b, lagging.primary, lagging.replica):  # (old enough to vote)
            wait_for(lambda s=server: s.call("INFO", "server")["uptime_in_seconds"] >= max_ttl,
                     "uptime", timeout=10)  # fmt: skip
        options = {"ttl": max_ttl, "max_ttl": max_ttl, "quarantine": quarantine}
        members = [a.url, cut.url, lagging.url]  # B behind a proxy that can drop its traffic
        holder_engine = redlock_of(members, **options)
        contender_engine = redlock_of(members, **options)
        with contender_engine.lock("warm"):  # (both engines know the members' identities)
            pass
        wait_for(lambda: switch_listeners(lagging) == 1, "our +switch-master listener")
        lagging.replication.delay = 5.0  # the replica lags from now on
        cut.blackhole()
        holder = holder_engine.lock("invoice")
        holder.acquire()  # on A and the primary only: B never receives it
        cut.heal()
        pipe = contender_engine.nodes[2].pipe
        new = lagging.failover()
        assert new.call("EXISTS", key("invoice")) == 0  # it never received the holder's key
        wait_for(lambda: pipe.closed, "the contender's pipe to the old primary closed")
        contender = contender_engine.lock("invoice")
        with ThreadPoolExecutor(1) as other:  # (not the holder's thread: a process of its own)
            won = other.submit(_try, contender).result()
        assert holder.validity > 0  # the holder still holds it
        if quarantine:
            assert isinstance(won, LockNotAcquired), won
            assert "quarantine (restarted or failed over" in str(won)
        else:
            assert won is None  # two holders at once: the hazard quarantine closes
        lagging.replication.delay = 0.0


def _try(lock) -> BaseException | None:
    try:
        lock.acquire()
    except LockNotAcquired as exc:
        return exc
    lock.release()
    return None


def _cycles(engine, resource: str, seconds: float, mode: str) -> list[float]:
    """How long each acquire+release cycle took, cycling for ``seconds`` (on a thread, or in
    an event loop)."""
    if mode == "async":
        return asyncio.run(_acycles(engine, resource, seconds))
    took: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        with engine.lock(resource):
            pass
        took.append(time.monotonic() - began)
    return took


async def _acycles(engine, resource: str, seconds: float) -> list[float]:
    took: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        async with engine.lock(resource):
            pass
        took.append(time.monotonic() - began)
    return took


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_silent_sentinel_zone_costs_one_budget_now_and_then_not_every_round(
    tmp_path, fresh_masters, redlock_of, mode
):
    """Was a bug: with a Sentinel member's whole zone silent (its primary, replica and three
    Sentinels SIGSTOPped: connections hang, nothing answers, as behind dropped packets) every
    reconnect asked the Sentinels one after another, a budget each, and "no Sentinel answered"
    was an error, not silence: the member was never set aside, and once its stalled connection
    was dropped every round (acquire and release) paid three budgets reconnecting. Now the
    Sentinels are asked at once within one budget, and a zone that does not answer is a silent
    member: left out for ``SKIP_SILENT_FOR`` as any silent master, tried again now and then."""
    budget = 0.2
    window = 4.0  # (several SKIP_SILENT_FOR: the stalled connection is dropped after the first)
    others = fresh_masters(2)
    with sentinel_group(tmp_path / "zone", sentinels=3) as zone:
        engine = redlock_of([zone.url, *others], ttl=5, node_timeout=budget)
        healthy = statistics.median(_cycles(engine, "zone", 0.5, mode))
        silenced = [zone.primary, zone.replica, *zone.sentinels]
        for server in silenced:
            server.pause()
        try:
            took = _cycles(engine, "zone", window, mode)
        finally:
            for server in silenced:
                server.resume()
    slow = [t for t in took if t > healthy + budget / 2]
    # A cycle pays at most one budget for the member (before: 3 Sentinels x 2 rounds = 1.2 s),
    # and only now and then: once per SKIP_SILENT_FOR at most (before: every cycle, once its
    # stalled connection was dropped).
    assert max(took) < healthy + budget + 0.3, took
    assert len(slow) <= 1 + window / SKIP_SILENT_FOR, slow
    assert sum(slow) < (1 + window / SKIP_SILENT_FOR) * (budget + 0.1), slow
