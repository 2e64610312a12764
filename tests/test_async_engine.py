"""The async twin on real masters: the same lock through ``async with`` / ``aacquire``.

Each test drives its own event loop with ``asyncio.run`` (no pytest plugin needed). Time bounds as
in test_engine_faults: one round within ``3 * NODE_TIMEOUT + 0.25 s``; a failed attempt (SET
round + cleanup round) within ``2 * NODE_TIMEOUT + 0.25 s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
import warnings

import pytest

from django_redlock.engine import LockContended, LockLost, NodeFailure, QuorumUnavailable
from django_redlock.testing.proxy import DelayProxy
from tests.conftest import await_until, until_set, wait_until

NODE_TIMEOUT = 0.1  # as in test_engine_faults: healthy masters answer in time on a busy machine
ROUND_BOUND = 3 * NODE_TIMEOUT + 0.25
FAILED_ATTEMPT_BOUND = 2 * NODE_TIMEOUT + 0.25
KEY = "redlock:lock:job"


@pytest.fixture
def engine_of(redlock_of):
    """An engine over any URLs, with this module's NODE_TIMEOUT."""
    return lambda urls, **options: redlock_of(urls, **{"node_timeout": NODE_TIMEOUT, **options})


def keys_of(masters, key=KEY):
    return [m.call("GET", key) for m in masters]


def urls(masters):
    return [m.url for m in masters]


def run(main):
    """``asyncio.run(main())``, then collect what it left behind here, with ResourceWarnings
    ignored: a connection the engine leaked would otherwise be garbage-collected during some later,
    unrelated test, whose ResourceWarning then fails that test under ``filterwarnings = error``.
    The leak tests at the end check for leaks on purpose."""
    result = asyncio.run(main())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    return result


def resource_warnings(main):
    """The ResourceWarnings raised by running ``main`` in its own loop and collecting after."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


async def timed(awaitable):
    started = time.monotonic()
    result = await awaitable
    return result, time.monotonic() - started


async def acquire_extend_release(engine, healthy, ttl=5.0):
    lock = engine.lock("job", ttl=ttl)
    _, elapsed = await timed(lock.aacquire())
    assert elapsed < ROUND_BOUND
    assert lock.held
    assert None not in keys_of(healthy)
    validity, elapsed = await timed(lock.aextend())
    assert elapsed < ROUND_BOUND
    assert 0 < validity < ttl
    _, elapsed = await timed(lock.arelease())
    assert elapsed < ROUND_BOUND
    assert keys_of(healthy) == [None] * len(healthy)


def test_async_with_holds_on_every_master_then_releases(any_masters, engine_of):
    engine = engine_of(urls(any_masters))

    async def main():
        async with engine.lock("job", ttl=5) as lock:
            assert lock.held
            assert 0 < lock.validity < 5
            values = keys_of(any_masters)
            assert None not in values
            assert len(set(values)) == 1
        assert not lock.held
        assert keys_of(any_masters) == [None] * len(any_masters)
        await acquire_extend_release(engine, any_masters)

    run(main)


def test_async_extend_renews_on_every_master(masters, engine_of):
    engine = engine_of(urls(masters))

    async def main():
        async with engine.lock("job", ttl=2) as lock:
            await asyncio.sleep(0.6)
            assert 1.5 < await lock.aextend() < 2
            # Not renewed, a master shows at most 1,400 ms by now; renewed, more for the next
            # 600 ms (the round returned at quorum: the last masters' renewals may land later).
            for m in masters:
                client = m.client()
                deadline = time.monotonic() + 0.5
                while not 1400 < client.pttl(KEY) <= 2000 and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert 1400 < client.pttl(KEY) <= 2000, m

    run(main)


def test_async_contention_names_every_master(masters, engine_of):
    engine, other = engine_of(urls(masters)), engine_of(urls(masters))

    async def main():
        async with engine.lock("job", ttl=5):
            with pytest.raises(LockContended) as caught:
                await other.lock("job", ttl=5).aacquire()
            assert caught.value.failures == tuple(NodeFailure(n.label, "held") for n in other.nodes)
            # Another task of the same engine is another owner too.
            with pytest.raises(LockContended):
                await asyncio.create_task(engine.lock("job", ttl=5).aacquire())

    run(main)


def test_async_wait_gets_the_lock_when_the_holder_releases(masters, engine_of):
    engine = engine_of(urls(masters), retry_delay=0.02)

    letting_go: list[float] = []

    async def hold(holding):
        # (wait=5: a single try of the holder may fail on a loaded machine.)
        async with engine.lock("job", ttl=5, wait=5):
            holding.set()
            await asyncio.sleep(0.2)
            letting_go.append(time.monotonic())

    async def main():
        holding = asyncio.Event()
        holder = asyncio.create_task(hold(holding))
        await until_set(holding, holder)
        started = time.monotonic()
        async with engine.lock("job", ttl=5, wait=5) as lock:
            assert lock.held
            acquired = time.monotonic()
        await holder
        # Not before the holder let go (timed by the holder: a late wake-up of this task after
        # ``holding`` cannot shorten it, as it could a lower bound on ``acquired - started``).
        assert acquired >= letting_go[0]
        assert acquired - started < 4

    run(main)


def test_async_lost_lease_raises_on_exit(masters, engine_of):
    engine = engine_of(urls(masters))

    async def main():
        with pytest.raises(LockLost):
            # ttl 1: the acquisition has 1 s to win (0.05 was missed under load), and the block
            # outlives it: it waits until the keys ran out on every master.
            async with engine.lock("job", ttl=1.0):
                assert await await_until(lambda: keys_of(masters) == [None] * 5, 10)

    run(main)


@pytest.mark.parametrize("paused", [1, 2])
def test_async_minority_paused_within_bound(fresh_masters, engine_of, paused):
    """Each operation within 3 * NODE_TIMEOUT + 0.25 s while 1 or 2 of 5 masters are SIGSTOPped."""
    masters = fresh_masters(5)
    engine = engine_of(urls(masters))

    async def main():
        await acquire_extend_release(engine, masters)  # connections pooled on this loop
        for m in masters[:paused]:
            m.pause()
        for _ in range(3):
            await acquire_extend_release(engine, masters[paused:])

    run(main)


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_async_majority_down_is_quorum_unavailable_within_bound(fresh_masters, engine_of, fault):
    """SET round + cleanup round: within 2 * NODE_TIMEOUT + 0.25 s; healthy masters cleaned."""
    masters = fresh_masters(5)
    engine = engine_of(urls(masters))

    async def main():
        await acquire_extend_release(engine, masters)
        for m in masters[:3]:
            getattr(m, fault)()
        lock = engine.lock("job", ttl=0.5)  # (never granted: the TTL is the partial keys')
        started = time.monotonic()
        with pytest.raises(QuorumUnavailable, match="only 2 of 5"):
            await lock.aacquire()
        assert time.monotonic() - started < FAILED_ATTEMPT_BOUND
        assert not lock.held
        assert keys_of(masters[3:]) == [None, None]

    run(main)


# --- cancellation --------------------------------------------------------------------------------


@pytest.fixture
def slow_first(masters):
    """The five shared masters, the first behind a proxy that adds 30 ms each way."""
    with DelayProxy(masters[0].port, delay=0.03) as proxy:
        yield [proxy.url, *urls(masters[1:])]


@pytest.mark.parametrize("cancel_after", [0.0, 0.002, 0.01, 0.04])
def test_cancelled_acquisition_leaves_no_stale_reply_and_no_key(
    masters, slow_first, engine_of, cancel_after
):
    """Cancel a task mid-acquisition (the slow master's reply still in flight). In the same loop,
    the same engine must then read true answers: a stale "OK" left on a pooled connection would
    count as a vote for the next request. We make that next request one that must be refused
    everywhere (another owner holds the resource), then a normal acquisition. And the cancelled
    attempt's keys must not outlive its TTL (in fact its shielded cleanup removes them at once)."""
    engine = engine_of(slow_first, node_timeout=0.5)  # long enough to wait for the slow master
    other = engine_of(urls(masters))
    ttl = 2.0

    async def main():
        task = asyncio.create_task(engine.lock("job", ttl=ttl).aacquire())
        await asyncio.sleep(cancel_after)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        cancelled_at = time.monotonic()
        # Every master now refuses "held": any granted vote would be a stale reply.
        async with other.lock("taken", ttl=ttl):
            # Its acquisition returned at quorum: let its last SETs land everywhere first.
            taken = other.lock_key("taken")
            for _ in range(50):
                if None not in keys_of(masters, taken):
                    break
                await asyncio.sleep(0.01)
            with pytest.raises(LockContended) as caught:
                await engine.lock("taken", ttl=ttl).aacquire()
        assert [f.reason for f in caught.value.failures] == ["held"] * 5
        # And a normal acquisition works, on all five masters.
        while time.monotonic() - cancelled_at < ttl + 0.5:
            if keys_of(masters) == [None] * 5:
                break
            await asyncio.sleep(0.02)
        assert keys_of(masters) == [None] * 5, "the cancelled attempt left a key past its TTL"
        async with engine.lock("job", ttl=ttl) as lock:
            assert lock.held
            # It returned at quorum: the slow master's SET lands a round trip later.
            assert keys_of(masters).count(None) <= 2
            assert await await_until(lambda: None not in keys_of(masters), 5)
        return time.monotonic() - cancelled_at

    run(main)
    # The last release returned at quorum: the slow master's compare-and-delete, already
    # written, lands a delayed round trip later (well within a second, far from the TTL).
    assert wait_until(lambda: keys_of(masters) == [None] * 5, timeout=1.0), keys_of(masters)


def test_cancelled_acquisition_cleans_up_at_once(masters, engine_of):
    """Stronger than 'gone after the TTL': the interrupted attempt undoes its SETs before the
    cancellation propagates (the cleanup round is shielded), on the slow masters too. Three of
    the five masters are slow, so that the round is still undecided (a round returns as soon
    as a quorum granted) when it is cancelled."""
    with contextlib.ExitStack() as stack:
        # 0.5 s each way: the round stays undecided for a second, which a loaded machine
        # cannot sleep through before the cancellation (30 ms each way could be).
        slow = [stack.enter_context(DelayProxy(m.port, delay=0.5)).url for m in masters[:3]]
        engine = engine_of([*slow, *urls(masters[3:])], node_timeout=3.0)

        async def main():
            task = asyncio.create_task(engine.lock("job", ttl=30).aacquire())
            # The fast masters have granted; the slow ones have not.
            assert await await_until(lambda: None not in keys_of(masters[3:]), 0.9)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert task.cancelled()
            assert keys_of(masters[3:]) == [None] * 2
            # Anything still in the proxies arrives, and is undone.
            assert await await_until(lambda: keys_of(masters) == [None] * 5, 5)

        run(main)


# --- connections do not outlive their use --------------------------------------------------------


def test_connections_per_loop_and_for_threads_close_with_their_loop_and_the_engine(
    masters, engine_of
):
    """Each master gets one pipelined connection for the process's threads and one per event
    loop; a loop that ended has its connections closed when the next loop connects (nothing is
    reported unclosed), and ``close()`` closes the rest. Counted at the masters' end, through
    proxies."""
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(DelayProxy(m.port)) for m in masters]
        engine = engine_of([p.url for p in proxies])

        async def main():
            for _ in range(3):  # one connection per master, whatever the number of rounds
                async with engine.lock("job", ttl=5):
                    pass
            # (Rounds return at quorum: on a loaded machine a master's connect may still be
            # under way when the last round returned. Wait for it, then count exactly one.)
            deadline = time.monotonic() + 10
            while [p.open_connections for p in proxies] != [1] * 5:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
            assert [p.open_connections for p in proxies] == [1] * 5

        for _ in range(3):
            assert resource_warnings(main) == []
        with engine.lock("job", ttl=5):
            pass
        # The last loop's and the threads' connection, per master; the two earlier loops' are
        # closed.
        assert wait_until(lambda: [p.open_connections for p in proxies] == [2] * 5, 1.0)
        engine.close()
        assert wait_until(lambda: [p.open_connections for p in proxies] == [0] * 5, 1.0)


def test_cancel_while_connecting_leaks_no_connection(masters, engine_of):
    """The last master's connection handshake is slow (its URL selects db 1, so connecting costs
    a SELECT round trip through a 0.1 s proxy): cancel while the engine waits for it, after the
    four others were connected and sent their SET. Was a bug: those connections were neither
    disconnected nor pooled, and the garbage collector reported them as unclosed transports."""
    with DelayProxy(masters[4].port, delay=0.1) as slow:
        engine = engine_of(
            [*urls(masters[:4]), f"redis://127.0.0.1:{slow.port}/1"], node_timeout=0.5
        )

        async def main():
            task = asyncio.create_task(engine.lock("job", ttl=2).aacquire())
            await asyncio.sleep(0.05)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        assert resource_warnings(main) == []
