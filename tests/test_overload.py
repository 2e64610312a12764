"""Overload and latency (issues 22 and 23 item 15): a process that asks faster than it can read
waits its turn locally instead of blaming healthy masters; a round returns at quorum; a release
that too few masters confirmed keeps trying. Real masters and real faults (proxies that delay
or swallow bytes)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time

import pytest

import django_redlock
from django_redlock.engine import Lock, LockLost, LockNotAcquired, Overloaded, QuorumUnavailable
from django_redlock.engine.waiting.admission import IN_FLIGHT
from django_redlock.testing.masters import LocalMaster
from django_redlock.testing.proxy import DelayProxy
from tests.conftest import wait_until


def keys_left(masters: list[LocalMaster], pattern: str = "*") -> int:
    return sum(len(m.client().keys(pattern)) for m in masters)


def left_on(masters: list[LocalMaster], key: str) -> dict[int, tuple[object, object]]:
    """Where ``key`` is still set: master port -> (its value, its PTTL); for a failure message."""
    return {
        m.port: (m.call("GET", key), m.call("PTTL", key)) for m in masters if m.call("EXISTS", key)
    }


def test_overloaded_is_a_lock_not_acquired_exported_everywhere():
    assert issubclass(Overloaded, LockNotAcquired)
    assert django_redlock.Overloaded is Overloaded


# --- a burst on healthy masters ------------------------------------------------------------------


def test_a_burst_on_healthy_masters_is_served_in_turn_and_leaves_no_key(masters, redlock_of):
    """Thousands of tasks at once, each one attempt at a key of its own: every one acquires and
    releases, no key is left on any master once they have answered the burst's releases, and no
    master is ever sent more than about ``IN_FLIGHT`` of our requests at once (the rest wait
    their turn here, costing no node budget): written all at once, they queued on the masters
    and, from about 10,000 tasks, were charged to them as missed budgets. (A 0.25 s budget: the
    default 50 ms was missed by masters sharing two CPUs with the suite and two burners, 143
    times in 2,500; what is measured here is how many requests a master is sent at once.)"""
    engine = redlock_of(masters, node_timeout=0.25)
    errors: collections.Counter[str] = collections.Counter()
    most_pending = 0

    async def one(i: int) -> None:
        try:
            async with engine.lock(f"burst:{i}", ttl=10, wait=0):
                await asyncio.sleep(0.005)
        except LockNotAcquired as exc:
            errors[type(exc).__name__] += 1
        except LockLost as exc:
            errors[f"LockLost(unconfirmed={exc.unconfirmed})"] += 1

    async def main() -> None:
        nonlocal most_pending
        loop = asyncio.get_running_loop()
        burst = asyncio.gather(*(one(i) for i in range(2500)))
        while not burst.done():
            pipes = [node.loop_pipe(loop) for node in engine.nodes]
            pending = [len(pipe.pending) for pipe in pipes if pipe is not None]
            most_pending = max(most_pending, *pending, 0)
            await asyncio.sleep(0.002)
        await burst
        # A release returns once a quorum confirmed it; the slower masters' releases are on the
        # wire, in order, and may still be queued there (~130 measured under load): the keys are
        # looked at once every master has answered everything sent to it.
        deadline = time.monotonic() + 5  # (the keys' TTL is 10 s)
        pipes = [node.loop_pipe(loop) for node in engine.nodes]
        while any(pipe.pending for pipe in pipes if pipe is not None):
            assert time.monotonic() < deadline, "masters still owe replies after 5 s"
            await asyncio.sleep(0.005)

    asyncio.run(main())
    assert errors == {}
    assert keys_left(masters, "redlock:lock:burst:*") == 0
    assert most_pending <= 2 * IN_FLIGHT


def test_a_request_held_up_in_this_process_does_not_cost_its_validity(masters, redlock_of):
    """Two acquisitions start in one loop tick; the first request of a tick is written at once,
    the next ones at its end, and a third task then blocks the loop for longer than the TTL.
    The second acquisition's requests leave only after that: its validity counts from then
    (the masters start its keys' TTL later still), so it is won. (The first one's replies were
    read that late too: too late for its TTL, truly.) The TTL is 1 s, the block 1.3 s: the
    second's round then has 1 s to end on a loaded machine (0.5 s left it 0.5 s)."""
    engine = redlock_of(masters)

    async def main() -> tuple[bool, BaseException | None]:
        async with engine.lock("warm-up", ttl=10):  # connections made, scripts loaded
            pass
        loop = asyncio.get_running_loop()
        first = loop.create_task(engine.lock("first", ttl=1.0).aacquire())
        second = loop.create_task(engine.lock("second", ttl=1.0).aacquire())

        async def busy() -> None:
            time.sleep(1.3)  # the loop is stuck: the tick's later requests wait in our buffer

        await asyncio.gather(busy(), return_exceptions=True)
        (held,) = await asyncio.gather(second)
        (outcome,) = await asyncio.gather(first, return_exceptions=True)
        await held.arelease()
        return held.held is False, outcome if isinstance(outcome, BaseException) else None

    released, first_error = asyncio.run(main())
    assert released  # it was won, then released
    assert isinstance(first_error, QuorumUnavailable)  # answered after its TTL


# --- Overloaded ----------------------------------------------------------------------------------


def test_a_wait_that_the_local_queue_cannot_meet_is_refused_at_once(masters, redlock_of):
    """Behind thousands of rounds queued in this process, a caller whose ``wait`` its place in
    the queue cannot meet is told so at once, with the queue's length (never after its wait,
    never as QuorumUnavailable); a caller with no wait of its own (one attempt) still gets in."""
    engine = redlock_of(masters)

    async def main() -> tuple[Overloaded, float, bool]:
        loop = asyncio.get_running_loop()
        burst: list[asyncio.Task[Lock]] = []

        def more(rounds: int) -> None:
            start = len(burst)
            burst.extend(
                loop.create_task(engine.lock(f"q:{i}", ttl=10).aacquire())
                for i in range(start, start + rounds)
            )

        more(3000)
        gate = engine.admission.of(loop)
        while not gate.pace.per_turn or gate.queued() < 200:  # the pace is measured, a queue left
            # A fast machine serves 3,000 rounds within about one pace window (0.1 s), so the
            # queue is topped up until the pace is known, whatever the machine's speed.
            if gate.queued() < 1000:
                assert len(burst) < 30_000, f"no pace measured after {len(burst)} rounds"
                more(1000)
            await asyncio.sleep(0.005)
        # A wait a quarter of what the queue ahead is expected to take (whatever this machine's
        # pace): surely not met. (Nothing else runs until the call below reaches the queue.)
        wait = round(gate.pace.expected(gate.queued()) / 4, 6)
        late = loop.create_task(engine.lock("late", ttl=10, wait=0).aacquire())
        with pytest.raises(Overloaded) as caught:
            await engine.lock("impatient", ttl=10, wait=wait).aacquire()
        for lock in [*await asyncio.gather(*burst), await late]:
            await lock.arelease()
        return caught.value, wait, late.result().held is False

    error, wait, late_held = asyncio.run(main())
    assert error.waited == 0.0  # refused at once: it did not wait
    assert error.queued >= 200
    assert f"{error.queued} rounds were queued ahead of it locally" in str(error)
    assert "refused at once" in str(error)
    assert f"wait={wait}s" in str(error)
    assert late_held  # it acquired (then released: no longer held)


def refused_behind_a_burst(engine, wait: float) -> tuple[Overloaded, float]:
    """Start 1,000 acquisitions on one loop, then one with ``wait`` behind them: its
    ``Overloaded``, and how long after its call it came. (Every lock released after.)"""

    async def main() -> tuple[Overloaded, float]:
        loop = asyncio.get_running_loop()
        burst = [loop.create_task(engine.lock(f"p:{i}", ttl=10).aacquire()) for i in range(1000)]
        await asyncio.sleep(0)  # the burst's tasks take the turns first
        try:
            called = time.monotonic()
            with pytest.raises(Overloaded) as caught:
                await engine.lock("impatient", ttl=10, wait=wait).aacquire()
            return caught.value, time.monotonic() - called
        finally:
            for lock in await asyncio.gather(*burst):
                await lock.arelease()

    return asyncio.run(main())


def test_a_turn_that_does_not_come_within_the_wait_is_overloaded(masters, redlock_of):
    """Before the queue's pace is known, a caller waits; if its turn does not come within its
    wait, it gets Overloaded (what it waited, and how many were ahead), not QuorumUnavailable.
    (A node budget of 1 s: the thousand releases at the end must not time out on a busy machine.)"""
    engine = redlock_of(masters, node_timeout=1.0)
    # A busy machine can take the whole millisecond between the call and the queue: then the
    # caller is refused without waiting (the next test). Tried again until it came with time left.
    tries = []
    for _ in range(5):
        error, refused_after = refused_behind_a_burst(engine, wait=0.001)
        tries.append(str(error))
        if "was over before it came to the queue" not in str(error):
            break
    else:
        pytest.fail(f"never came to the queue within its wait: {tries}")
    assert not isinstance(error, QuorumUnavailable)
    assert error.queued > 0
    # It waited its wait, then was refused: the refusal came no sooner than the wait after the
    # call. ``waited`` is its time in the queue: at least what was left of the wait when it
    # queued (the wait less what came before: 1.3 us short of 0.001 s once, which the old
    # ``waited >= 0.001`` refused), and no more than the whole.
    assert refused_after >= 0.001
    assert 0 < error.waited <= refused_after
    assert f"waited {error.waited:.3f}s for its turn" in str(error)
    assert "the masters were not asked" in str(error)


def test_a_wait_spent_before_the_queue_is_refused_at_once_and_says_so(masters, redlock_of):
    """A caller whose wait is over by the time it comes to the queue (1 us: always) is refused
    at once, whatever the queue's pace (not yet known here), and told why: not "its turn was
    expected in 0.000s", as it once was."""
    engine = redlock_of(masters, node_timeout=1.0)
    error, _ = refused_behind_a_burst(engine, wait=1e-6)
    assert error.waited == 0.0
    assert error.queued > 0
    assert "its wait was over before it came to the queue, refused at once" in str(error)
    assert "expected in" not in str(error)


# --- return at quorum ----------------------------------------------------------------------------


@pytest.fixture
def one_slow(masters):
    """Three masters, the first behind a proxy adding 0.5 s each way (a 1 s round trip: a return
    at quorum is told from a wait for it by 0.5 s either way, which load cannot blur; 150 ms
    each way left 150 ms, and an acquisition on a loaded machine took 175 ms)."""
    with DelayProxy(masters[0].port, delay=0.5) as proxy:
        yield [proxy.url, masters[1].url, masters[2].url], masters[:3]


def test_an_acquisition_returns_at_quorum_without_the_slow_master(one_slow, redlock_of):
    """Two fast masters of three grant at once: the acquisition, the extension and the release
    return then, not a slow master's round trip (1 s) later. The slow master's replies
    complete in the background, without marking it silent; its key is removed in order by the
    release that follows it on the same connection."""
    urls, masters = one_slow
    engine = redlock_of(urls, node_timeout=3.0)
    key = engine.lock_key(SLOW_JOB)
    sets_before = masters[0].commands_run("set")
    with engine.lock(SLOW_JOB, ttl=60):  # connects, loads scripts
        pass
    took = {}
    started = time.monotonic()
    lock = engine.lock(SLOW_JOB, ttl=60).acquire()
    took["acquire"] = time.monotonic() - started
    started = time.monotonic()
    lock.extend()
    took["extend"] = time.monotonic() - started
    assert sum(m.call("EXISTS", key) for m in masters[1:]) == 2
    ours = masters[1].call("GET", key)
    started = time.monotonic()
    lock.release()
    took["release"] = time.monotonic() - started
    assert all(seconds < 0.5 for seconds in took.values()), took
    assert engine.nodes[0].silent_until == 0.0
    removed_in_order(masters, key, ours, sets_before)


def test_an_async_acquisition_returns_at_quorum_without_the_slow_master(one_slow, redlock_of):
    urls, masters = one_slow
    engine = redlock_of(urls, node_timeout=3.0)
    key = engine.lock_key(SLOW_JOB)
    sets_before = masters[0].commands_run("set")

    async def main() -> tuple[float, object]:
        async with engine.lock(SLOW_JOB, ttl=60):  # connects, loads scripts
            pass
        started = time.monotonic()
        async with engine.lock(SLOW_JOB, ttl=60):
            took = time.monotonic() - started
            ours = masters[1].call("GET", key)
        return took, ours

    took, ours = asyncio.run(main())
    assert took < 0.5
    assert engine.nodes[0].silent_until == 0.0
    removed_in_order(masters, key, ours, sets_before)


#: A name no other test locks (they share these masters).
SLOW_JOB = "slow-master-job"


def removed_in_order(masters: list[LocalMaster], key: str, ours: object, sets_before: int) -> None:
    """The slow master runs both SETs (the warm-up's and the lock's) 0.5 s after they left,
    and the release behind the second one just after it: the key is removed there, long before
    its 60 s TTL. Checked only once the slow master has run both SETs: before that, "no key
    anywhere" is true and proves nothing. (That is what once failed in CI: a first look before
    the second SET, and the last look between it and its release.)"""

    def removed() -> bool:
        both_sets_ran = masters[0].commands_run("set") >= sets_before + 2  # read before the keys
        return both_sets_ran and not left_on(masters, key)

    assert wait_until(removed, 20.0), (left_on(masters, key), ours, masters[0].commands_run("set"))


# --- releases keep trying ------------------------------------------------------------------------


@pytest.fixture
def three_cut(masters):
    """Five masters, three of them behind proxies that can swallow every byte (blackhole)."""
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(DelayProxy(m.port)) for m in masters[:3]]
        yield [p.url for p in proxies] + [m.url for m in masters[3:]], proxies


def held_then_cut(engine, masters, proxies):
    """A lock on all five masters (it returned at quorum: its last SETs land a moment later),
    then the three behind ``proxies`` cut off."""
    # (A wait: on a loaded machine a first round can miss its 50 ms budget on three masters.)
    lock = engine.lock("job", ttl=10, wait=10).acquire()
    deadline = time.monotonic() + 1.0
    while keys_left(masters, "redlock:lock:job") < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    for proxy in proxies:
        proxy.blackhole()
    return lock


def test_a_release_is_retried_until_a_quorum_confirmed_it_then_no_more(
    masters, three_cut, redlock_of
):
    """Three of five masters swallow the release (it never reaches them: no late reply will
    remove the key). The caller is told at once that it is unconfirmed (in the same time as
    before: one round); the release is retried in the background, and once the masters heal
    and a quorum confirmed it, it stops."""
    urls, proxies = three_cut
    engine = redlock_of(urls, node_timeout=0.05, retry_delay=0.1)
    lock = held_then_cut(engine, masters, proxies)
    started = time.monotonic()
    try:
        with pytest.raises(LockLost) as caught:
            lock.release()
        took = time.monotonic() - started
        time.sleep(0.3)  # retried meanwhile, swallowed too
        assert keys_left(masters[:3], "redlock:lock:job") == 3
    finally:
        for proxy in proxies:
            proxy.heal()
    assert caught.value.unconfirmed
    assert not lock.lost
    assert took < 0.05 + 0.25  # one round's budget, and local slack
    deadline = time.monotonic() + 3.0  # masters left out as silent are asked again within 1 s
    while keys_left(masters, "redlock:lock:job") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert keys_left(masters, "redlock:lock:job") == 0
    time.sleep(0.3)  # any retry in flight has arrived
    before = [m.commands_run("eval", "evalsha") for m in masters]
    time.sleep(0.5)  # five retry delays: no more retries
    assert [m.commands_run("eval", "evalsha") for m in masters] == before


def test_an_unconfirmed_release_keeps_trying_in_the_background(masters, three_cut, redlock_of):
    """The masters stay cut longer than the caller waits: it is told the release is
    unconfirmed, and the release goes on in the background, so that the keys are removed as
    soon as the masters can be reached again, long before their 10 s TTL."""
    urls, proxies = three_cut
    engine = redlock_of(urls, node_timeout=0.05, retry_delay=0.2)
    lock = held_then_cut(engine, masters, proxies)
    try:
        with pytest.raises(LockLost) as caught:
            lock.release()
        assert caught.value.unconfirmed
        assert keys_left(masters[:3], "redlock:lock:job") == 3  # swallowed
    finally:
        for proxy in proxies:
            proxy.heal()
    deadline = time.monotonic() + 3.0
    while keys_left(masters, "redlock:lock:job") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert keys_left(masters, "redlock:lock:job") == 0
