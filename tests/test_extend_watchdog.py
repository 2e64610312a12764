"""Extending a lease and the watchdog under pressure (issue 23, items 1, 3-6): an interrupted
shorter extend, renewals of many leases with one master far away, slow callbacks, extend(ttl=)
rescheduling the watchdog and overlapping its renewals, max_extensions counted with the round.

Real masters; a master "far away" or "slow" is one behind a ``DelayProxy`` adding its delay to
each direction (a request still lands, late, after its client gave up on it)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from django_redlock import redlock
from django_redlock.engine import Lock, Redlock
from django_redlock.engine.base.errors import ExtensionLimit, LockLost
from django_redlock.signals import lock_lost
from django_redlock.testing.masters import LocalMaster
from django_redlock.testing.proxy import DelayProxy
from tests.conftest import wait_until


@contextlib.contextmanager
def proxied(masters: list[LocalMaster]) -> Iterator[list[DelayProxy]]:
    """A DelayProxy (no delay yet) in front of each of ``masters``."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(DelayProxy(m.port)) for m in masters]


def pttls(masters: list[LocalMaster], key: str) -> list[int]:
    return [m.call("PTTL", key) for m in masters]


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


# --- 1. an interrupted shorter extend -------------------------------------------------------------


def test_a_shorter_aextend_cut_by_a_timeout_shortens_the_lease(masters, redlock_of):
    """The masters apply ttl=0.5 although the caller gave up before their replies: from then
    on the lease must claim no more than 0.5 s, and once that is over another client's
    acquisition must find it free while the first no longer says it holds the lock."""
    three = masters[:3]
    with proxied(three) as proxies:
        engine = redlock_of([p.url for p in proxies], node_timeout=0.5)
        other = redlock_of(three)

        async def main() -> None:
            lock = await engine.lock("r", ttl=10).aacquire()
            for proxy in proxies:
                proxy.delay = 0.15  # each request lands 0.15 s after it left
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.1):
                    await lock.aextend(ttl=0.5)  # short: what the lease is cut to is tested
            assert lock.validity <= 0.5
            rival = await other.lock("r", ttl=5, wait=3).aacquire()  # once our 0.5 s is over
            assert not lock.held
            assert lock.lost
            await rival.arelease()
            with pytest.raises(LockLost):
                await lock.arelease()

        asyncio.run(main())


class Interrupted(BaseException):
    """What a signal handler raises in the middle of a blocking extend (as Ctrl-C would)."""


def test_a_shorter_extend_interrupted_by_a_signal_shortens_the_lease(masters, redlock_of):
    three = masters[:3]
    with proxied(three) as proxies:
        engine = redlock_of([p.url for p in proxies], node_timeout=2.0)
        lock = engine.lock("r", ttl=10).acquire()
        for proxy in proxies:
            proxy.delay = 0.6  # the requests land long after the interruption

        def interrupt(signum: int, frame: object) -> None:
            raise Interrupted

        previous = signal.signal(signal.SIGALRM, interrupt)
        try:
            # 0.3 s: the requests have left by then, even on a loaded machine (a thread held
            # up 0.1 s before writing them was interrupted before it sent anything).
            signal.setitimer(signal.ITIMER_REAL, 0.3)
            with pytest.raises(Interrupted):
                lock.extend(ttl=0.5)  # short: what the lease is cut to is tested
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        assert lock.validity <= 0.5
        rival = redlock_of(three).lock("r", ttl=5, wait=3).acquire()
        assert not lock.held
        rival.release()
        with pytest.raises(LockLost):
            lock.release()


# --- 3. renewals at scale -------------------------------------------------------------------------


def test_two_hundred_leases_are_renewed_with_one_master_40ms_away(masters, redlock_of):
    """Renewals go out together, not one round trip after another: 200 leases with a 2 s TTL
    (each renewed every 0.67 s) through a master 40 ms away (20 ms each way) are all kept; one
    after another, a round of renewals would take 8 s. (A 0.25 s budget: with the default
    50 ms, 40 ms away left a loaded machine 10 ms, and this test failed under two CPU
    burners.)"""
    three = masters[:3]
    with DelayProxy(three[0].port, delay=0.02) as far:
        engine = redlock_of([far.url, three[1].url, three[2].url], node_timeout=0.25)
        locks = [engine.lock(f"many:{i}", ttl=2, auto_extend=True) for i in range(200)]

        async def main() -> None:
            await asyncio.gather(*(lock.aacquire() for lock in locks))
            await asyncio.sleep(6)
            kept = [lock for lock in locks if lock.held]
            lost = [lock.resource for lock in locks if lock.lost]
            assert (len(kept), lost) == (200, [])
            await asyncio.gather(*(lock.arelease() for lock in locks))

        asyncio.run(main())


# --- 4. callbacks never delay a renewal -----------------------------------------------------------


def test_a_slow_on_lost_does_not_delay_other_renewals(masters, redlock_of):
    engine = redlock_of(masters)
    called = threading.Event()
    go_on = threading.Event()

    def slow(lock: Lock, error: LockLost) -> None:
        called.set()
        go_on.wait(3)  # a callback that takes 3 s (an e-mail, a metrics push)

    kept = [engine.lock(f"kept:{i}", ttl=1, auto_extend=True).acquire() for i in range(5)]
    short = engine.lock("short", ttl=1.0, on_lost=slow).acquire()  # runs out while held: told
    try:
        assert called.wait(5)
        time.sleep(1.2)  # more than a TTL of the kept leases, while the callback still runs
        assert [lock.held for lock in kept] == [True] * 5
    finally:
        go_on.set()
    for lock in kept:
        lock.release()
    with pytest.raises(LockLost):
        short.release()


def test_a_slow_lock_lost_receiver_does_not_delay_other_renewals(redlock_settings):
    """Django's signals go through the observer: a receiver that takes 3 s (an e-mail, a
    metrics push) must not hold back renewals either."""
    told = threading.Event()
    go_on = threading.Event()

    def slow(sender: object, **kwargs: object) -> None:
        told.set()
        go_on.wait(3)

    lock_lost.connect(slow)
    try:
        kept = [redlock(f"kept:{i}", ttl=1, auto_extend=True).acquire() for i in range(5)]
        short = redlock("short", ttl=1.0).acquire()  # runs out while held: told
        try:
            assert told.wait(5)
            time.sleep(1.2)  # more than a TTL of the kept leases, while the receiver still runs
            assert [lock.held for lock in kept] == [True] * 5
        finally:
            go_on.set()
        for lock in kept:
            lock.release()
        with pytest.raises(LockLost):
            short.release()
    finally:
        lock_lost.disconnect(slow)


# --- 5. extend(ttl=) reschedules the watchdog, and the last round sent decides --------------------


def test_a_shorter_extend_reschedules_the_renewal(masters, redlock_of):
    """ttl=6, renewed every 2 s; extended to 1 s, it must be renewed every 1/3 s from then on,
    not at the old 2 s mark (by then it has run out). (1 s, not less: a renewal may come 2/3 s
    late on a loaded machine.)"""
    with redlock_of(masters).lock("r", ttl=6, auto_extend=True) as lock:
        assert lock.extend(ttl=1.0) <= 1.0
        time.sleep(1.5)  # past the 1 s lease, before the old renewal mark
        assert lock.held
        assert all(0 < p <= 1000 for p in pttls(masters, lock.key))


def test_a_shorter_extend_brings_the_expiry_notice_forward(masters, redlock_of):
    told: list[float] = []
    lock = redlock_of(masters).lock(
        "r", ttl=5, on_lost=lambda lock, error: told.append(time.monotonic())
    )
    lock.acquire()
    lock.extend(ttl=1.0)
    extended = time.monotonic()
    assert wait_until(lambda: told, 4), "no expiry notice within 4 s of a 1 s lease"
    assert told[0] - extended < 1.5  # at the new expiry, not at the old one (5 s)
    with pytest.raises(LockLost):
        lock.release()


def _slow_engine(redlock_of, proxies: list[DelayProxy]) -> Redlock:  # type: ignore[no-untyped-def]
    return redlock_of([p.url for p in proxies], node_timeout=0.9)  # type: ignore[no-any-return]


def test_an_extend_sent_before_a_renewal_keeps_its_ttl(masters, redlock_of):
    """ttl=3 auto-extended (renewal due 1 s after acquiring); masters 0.3 s away each way. The
    holder's extend(ttl=1) leaves at 0.8 s, before the renewal is due, and is answered at
    1.4 s; a renewal that leaves after it must carry ttl=1 too, not put the old 3 s back (on
    the masters, or in the lease)."""
    three = masters[:3]
    with proxied(three) as proxies:
        lock = _slow_engine(redlock_of, proxies).lock("r", ttl=3, auto_extend=True).acquire()
        acquired = time.monotonic()
        for proxy in proxies:
            proxy.delay = 0.3
        sleep_until(acquired + 0.8)
        lock.extend(ttl=1)
        sleep_until(acquired + 1.8)  # a renewal due at 1.0 s would have been answered by 1.6 s
        assert lock.validity <= 1
        assert all(p <= 1000 for p in pttls(three, lock.key))
        for proxy in proxies:
            proxy.delay = 0
        with contextlib.suppress(LockLost):
            lock.release()


def test_a_renewal_answered_after_a_later_extend_began_does_not_count(masters, redlock_of):
    """The renewal leaves at 1.0 s with ttl=3 (answered at 1.6 s); the holder's extend(ttl=1)
    leaves at 1.1 s (answered at 1.7 s). Between the two answers the lease must not claim the
    renewal's 3 s: the extend sent later may land later, and then the masters hold 1 s."""
    three = masters[:3]
    with proxied(three) as proxies:
        engine = _slow_engine(redlock_of, proxies)
        lock = engine.lock("r", ttl=3, auto_extend=True).acquire()
        lease = engine.holders[lock.key]
        acquired = time.monotonic()
        for proxy in proxies:
            proxy.delay = 0.3
        seen: list[float] = []

        def watch() -> None:
            sleep_until(acquired + 1.2)
            while time.monotonic() < acquired + 1.65:
                seen.append(lease.valid_until - time.monotonic())
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        sleep_until(acquired + 1.1)
        lock.extend(ttl=1)
        watcher.join()
        assert seen
        assert max(seen) <= 1
        for proxy in proxies:
            proxy.delay = 0
        with contextlib.suppress(LockLost):
            lock.release()


def test_a_longer_extend_overtaking_a_renewal_in_flight_claims_no_more(masters, redlock_of):
    """ttl=1.5, renewal due 0.5 s after acquiring, sent on the watchdog's connections while the
    masters are 0.4 s away (it lands at about 0.9 s). At 0.75 s the holder's extend(ttl=5)
    leaves on its own connections, now 0.05 s away: it lands first and is answered first. The
    renewal then puts 1.5 s back on the masters: the lease must not claim the holder's 5 s."""
    three = masters[:3]
    with proxied(three) as proxies:
        engine = _slow_engine(redlock_of, proxies)
        lock = engine.lock("r", ttl=1.5, auto_extend=True).acquire()
        acquired = time.monotonic()
        sleep_until(acquired + 0.35)
        for proxy in proxies:
            proxy.delay = 0.4  # what the renewal (due at 0.5 s) is sent through
        sleep_until(acquired + 0.75)
        for proxy in proxies:
            proxy.delay = 0.05
        lock.extend(ttl=5)
        sleep_until(acquired + 1.1)  # the renewal landed (0.9 s) after the holder's extend
        on_masters = min(pttls(three, lock.key)) / 1000
        assert on_masters < 1.5  # (the scenario happened: the renewal landed last)
        assert lock.validity <= on_masters
        for proxy in proxies:
            proxy.delay = 0
        with contextlib.suppress(LockLost):
            lock.release()


# --- 6. max_extensions counted with the round -----------------------------------------------------


def test_max_extensions_holds_when_an_extend_overlaps_a_renewal(masters, redlock_of):
    """max_extensions=1: the renewal leaves at 1.0 s (answered at 1.6 s); an extend() at 1.2 s
    must be refused, not make a second extension."""
    three = masters[:3]
    with proxied(three) as proxies:
        engine = _slow_engine(redlock_of, proxies)
        lock = engine.lock("r", ttl=3, auto_extend=True, max_extensions=1).acquire()
        lease = engine.holders[lock.key]
        acquired = time.monotonic()
        for proxy in proxies:
            proxy.delay = 0.3
        sleep_until(acquired + 1.2)
        with pytest.raises(ExtensionLimit, match="max_extensions=1"):
            lock.extend()
        sleep_until(acquired + 1.8)
        assert lease.extensions == 1
        for proxy in proxies:
            proxy.delay = 0
        lock.release()


def test_max_extensions_holds_when_a_renewal_falls_due_during_an_extend(masters, redlock_of):
    """max_extensions=1: the holder's extend() leaves at 0.8 s (answered at 1.4 s); the
    renewal due at 1.0 s must not make a second extension."""
    three = masters[:3]
    with proxied(three) as proxies:
        engine = _slow_engine(redlock_of, proxies)
        lock = engine.lock("r", ttl=3, auto_extend=True, max_extensions=1).acquire()
        lease = engine.holders[lock.key]
        acquired = time.monotonic()
        for proxy in proxies:
            proxy.delay = 0.3
        sleep_until(acquired + 0.8)
        lock.extend()
        sleep_until(acquired + 2.0)
        assert lease.extensions == 1
        for proxy in proxies:
            proxy.delay = 0
        lock.release()
