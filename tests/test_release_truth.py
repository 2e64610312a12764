"""What ``release()`` says, row by row of the truth table in docs/api.md (confirmed, not
confirmed, lost, lost and already told), sync and async, on real masters with real faults: kill,
restart empty, SIGSTOP, keys removed by force. And the restart rule: a master asked again that
finds our lease gone confirms the release only if it did not restart since the grant."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest

from django_redlock.engine import LockLost, Redlock
from django_redlock.testing.masters import LocalMaster
from django_redlock.testing.proxy import DelayProxy
from tests.conftest import wait_until


class Told:
    """What ``on_lost`` was told."""

    def __init__(self) -> None:
        self.errors: list[LockLost] = []

    def __call__(self, lock: object, error: LockLost) -> None:
        self.errors.append(error)


def restart(masters: list[LocalMaster]) -> None:
    for m in masters:
        m.restart()


# --- the rows, each sync and async --------------------------------------------------------------


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run_holding(
    engine: Redlock,
    mode: str,
    make: Callable[[], Any],
    fault: Callable[[Any], None],
) -> tuple[BaseException | None, bool]:
    """Acquire ``make()``'s lock, run ``fault(lock)`` (in the holder's thread: a blocking call),
    then release it explicitly; what the release raised, and ``lock.lost`` as its owner reads
    it after the release."""
    lock = make()
    if mode == "sync":
        lock.acquire()
        fault(lock)
        try:
            lock.release()
        except LockLost as error:
            return error, lock.lost
        return None, lock.lost

    async def main() -> tuple[BaseException | None, bool]:
        await lock.aacquire()
        await asyncio.get_running_loop().run_in_executor(None, fault, lock)
        try:
            await lock.arelease()
        except LockLost as error:
            return error, lock.lost
        return None, lock.lost

    return asyncio.run(main())


def run_block(engine: Redlock, mode: str, make: Callable[[], Any], fault: Callable[[Any], None]):
    """The same inside a ``with`` / ``async with`` block: what leaving it raised (a list: once)."""
    lock = make()
    raised: list[BaseException] = []
    if mode == "sync":
        try:
            with lock:
                fault(lock)
        except LockLost as error:
            raised.append(error)
        return lock, raised

    async def main() -> None:
        try:
            async with lock:
                await asyncio.get_running_loop().run_in_executor(None, fault, lock)
        except LockLost as error:
            raised.append(error)

    asyncio.run(main())
    return lock, raised


def test_confirmed_returns(fresh_masters, redlock_of, mode):
    masters = fresh_masters(3)
    engine = redlock_of(masters)
    told = Told()
    error, lost = run_holding(
        engine, mode, lambda: engine.lock("row", ttl=10, on_lost=told), lambda lock: None
    )
    assert error is None
    assert not lost
    assert told.errors == []
    assert [m.call("GET", "redlock:lock:row") for m in masters] == [None, None, None]


def test_not_confirmed_raises_unconfirmed_and_a_block_does_not(fresh_masters, redlock_of, mode):
    """Too few masters answered (2 of 3 killed while held): nothing says the lease was lost."""
    masters = fresh_masters(3)
    engine = redlock_of(masters, node_timeout=0.2)
    told = Told()

    def kill_two(lock: Any) -> None:
        for m in masters[:2]:
            m.kill()

    error, lost = run_holding(
        engine, mode, lambda: engine.lock("row", ttl=10, on_lost=told), kill_two
    )
    assert isinstance(error, LockLost)
    assert error.unconfirmed, error
    assert not lost
    assert told.errors == []
    for m in masters[:2]:
        m.start()
    lock, raised = run_block(
        engine, mode, lambda: engine.lock("row2", ttl=10, on_lost=told), kill_two
    )
    assert raised == []  # its section was safe
    assert told.errors == []


def test_lost_at_the_release_raises_tells_once(fresh_masters, redlock_of, mode):
    """Our keys removed by force on 2 of 3 masters: the release finds the lease lost, says so
    (not as unconfirmed) and tells ``on_lost`` once; a block raises it once."""
    masters = fresh_masters(3)
    engine = redlock_of(masters)
    told = Told()

    def force(lock: Any) -> None:
        for m in masters[:2]:
            m.call("DEL", lock.key)

    error, lost = run_holding(engine, mode, lambda: engine.lock("row", ttl=10, on_lost=told), force)
    assert isinstance(error, LockLost), error
    assert not error.unconfirmed, error
    assert lost
    assert wait_until(lambda: len(told.errors) == 1, 5), told.errors
    lock, raised = run_block(engine, mode, lambda: engine.lock("row2", ttl=10, on_lost=told), force)
    assert len(raised) == 1, raised
    assert not raised[0].unconfirmed  # type: ignore[attr-defined]
    assert wait_until(lambda: len(told.errors) == 2, 5), told.errors


@pytest.mark.parametrize("how", ["restart", "pause"])
def test_lost_and_already_told_raises_again_without_telling_again(
    fresh_masters, redlock_of, mode, how
):
    """An auto-extended lock whose renewals fail on 2 of 3 masters (restarted empty; or paused
    until the lease ran out, then resumed: they still hold our key, and the release is confirmed
    by a quorum): the watchdog marks it lost and tells. A later explicit release raises LockLost
    too (not as unconfirmed), and ``on_lost`` is not told twice; a block raises once."""
    masters = fresh_masters(3)
    engine = redlock_of(masters, node_timeout=0.2)
    told = Told()

    def lose(lock: Any) -> None:
        if how == "restart":
            restart(masters[:2])
        else:
            for m in masters[:2]:
                m.pause()
        try:
            assert wait_until(lambda: told.errors, 10), "the watchdog never found it lost"
        finally:
            for m in masters[:2]:
                if m.paused:
                    m.resume()

    make = lambda: engine.lock("row", ttl=1.5, auto_extend=True, on_lost=told)  # noqa: E731
    error, lost = run_holding(engine, mode, make, lose)
    assert isinstance(error, LockLost), error
    assert not error.unconfirmed, error
    assert lost
    assert len(told.errors) == 1, told.errors
    told.errors.clear()
    lock, raised = run_block(engine, mode, make, lose)
    assert len(raised) == 1, raised
    assert not raised[0].unconfirmed  # type: ignore[attr-defined]
    assert len(told.errors) == 1, told.errors


# --- item: a master that restarted empty is no confirmation --------------------------------------


@pytest.mark.parametrize("other_takes_it", [False, True], ids=["alone", "second-holder"])
def test_a_release_after_a_majority_restarted_empty_is_lost(
    fresh_masters, redlock_of, mode, other_takes_it
):
    """2 of 3 masters restart empty while A holds the lock (and, in one run, B then takes it on
    them). A's release is asked again on those two (their connections broke), finds nothing:
    that is no confirmation, since they restarted after the grant. LockLost, lost, told."""
    masters = fresh_masters(3)
    engine, other = redlock_of(masters), redlock_of(masters)
    told = Told()

    def restart_two(lock: Any) -> None:
        restart(masters[:2])
        if other_takes_it:
            second = other.lock("row", ttl=10, wait=5)
            second.acquire()

    error, lost = run_holding(
        engine, mode, lambda: engine.lock("row", ttl=10, on_lost=told), restart_two
    )
    assert isinstance(error, LockLost), "a release counted masters that restarted empty"
    assert not error.unconfirmed, error
    assert lost
    if mode == "sync":  # (a loop's pipes saw their connections close: their first reply is "gone")
        assert "restarted" in str(error), error
    assert wait_until(lambda: len(told.errors) == 1, 5), told.errors


def test_a_restart_at_once_after_the_grant_is_told_apart_from_a_reset(fresh_masters, redlock_of):
    """Restarted a moment after the grant (no time passes for an uptime to show): the new
    connection's run_id says it is another process, so the lease is lost there, as a block
    leaving at once finds too."""
    masters = fresh_masters(3)
    engine = redlock_of(masters)
    told = Told()
    with pytest.raises(LockLost) as raised, engine.lock("row", ttl=10, on_lost=told) as lock:
        restart(masters[:2])
    assert not raised.value.unconfirmed, raised.value
    assert "restarted since the grant" in str(raised.value), raised.value
    assert lock.lost
    assert wait_until(lambda: len(told.errors) == 1, 5), told.errors


def test_quarantine_reads_a_restart_since_the_grant_as_gone(fresh_masters, redlock_of):
    """With quarantine on, the restarted members abstain; their new run_id was seen after the
    grant, so the release reports the lease lost, not merely unconfirmed."""
    masters = fresh_masters(3)
    engine = redlock_of(masters, ttl=2, max_ttl=2, quarantine=True)
    begun = time.monotonic()
    assert wait_until(
        lambda: all(m.client().info("server")["uptime_in_seconds"] >= 2 for m in masters), 10
    ), "masters never up MAX_TTL"
    assert time.monotonic() - begun < 10
    told = Told()
    lock = engine.lock("row", ttl=2, on_lost=told)
    lock.acquire()
    restart(masters[:2])
    with pytest.raises(LockLost) as raised:
        lock.release()
    assert not raised.value.unconfirmed, raised.value
    assert "restarted" in str(raised.value), raised.value


# --- a master that will not say which process it is ----------------------------------------------


def no_info_urls(masters: list[LocalMaster], ports: list[int]) -> list[str]:
    """URLs (through ``ports``) for a user "locker" that may do anything but ``INFO``."""
    for m in masters:
        m.call("ACL", "SETUSER", "locker", "reset", "on", ">pw", "~*", "&*", "+@all", "-info")
    return [f"redis://locker:pw@127.0.0.1:{port}/0" for port in ports]


def test_a_user_refused_info_still_locks(fresh_masters, redlock_of):
    masters = fresh_masters(3)
    engine = redlock_of(no_info_urls(masters, [m.port for m in masters]))

    async def async_cycle() -> None:
        async with engine.lock("row-async", ttl=10):
            pass

    with engine.lock("row", ttl=10) as lock:
        assert lock.held
    asyncio.run(async_cycle())
    assert all(node.server.run_id is None for node in engine.nodes)


def test_a_reset_release_on_masters_that_cannot_say_who_they_are_is_not_confirmed(
    fresh_masters, redlock_of
):
    """Without their run_id a reset cannot be told from a restart: the release asked again that
    finds our lease gone does not confirm there (unconfirmed, never a silent success)."""
    masters = fresh_masters(3)
    with contextlib.ExitStack() as stack:
        fronts = [stack.enter_context(DelayProxy(m.port)) for m in masters]
        engine = redlock_of(no_info_urls(masters, [f.port for f in fronts]))
        lock = engine.lock("row", ttl=10)
        lock.acquire()
        for front in fronts[:2]:
            front.reset_next_reply()
        with pytest.raises(LockLost) as raised:
            lock.release()
        assert raised.value.unconfirmed, raised.value
        assert "never said which server process" in str(raised.value), raised.value
