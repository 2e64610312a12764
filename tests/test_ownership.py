"""Who holds a lease, as issue 23 found it misjudged: async queries inside task wrappers (item 9),
a forked child (item 8), re-entry of part of a held lock (item 12) and re-entry of a shared
handle (item 13). Real redis-server masters."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable

import pytest

from django_redlock.engine import LockContended

# --- 9. async queries run by asyncio in a task of their own -------------------------------------


def test_async_queries_inside_gather_and_wait_for_speak_of_the_callers_lease(masters, redlock_of):
    engine = redlock_of(masters)
    lock = engine.lock("wrapped", ttl=10)
    several = engine.lock("wrapped:a", "wrapped:b", ttl=10)

    async def main() -> list[object]:
        async with lock, several:
            gathered = await asyncio.gather(
                lock.aowned(), lock.aextend(), lock.afence(), several.afences()
            )
            waited = [
                await asyncio.wait_for(lock.aowned(), 5),
                await asyncio.wait_for(lock.aextend(ttl=8), 5),
                await asyncio.wait_for(lock.afence(), 5),
            ]
        return [*gathered, *waited]

    held, extended, fence, fences, held_again, extended_again, fence_again = asyncio.run(main())
    assert (held, held_again) == (True, True)
    assert 9 < extended <= 10
    assert 7 < extended_again <= 8
    assert fence == fence_again > 0
    assert sorted(fences) == ["wrapped:a", "wrapped:b"]


def test_an_async_query_still_refuses_a_task_that_does_not_hold_it(masters, redlock_of):
    engine = redlock_of(masters)
    lock = engine.lock("wrapped", ttl=10)

    async def main() -> tuple[bool, str]:
        await lock.aacquire()
        try:

            async def intruder() -> tuple[bool, str]:
                try:
                    await lock.aextend()
                except RuntimeError as error:
                    return await lock.aowned(), str(error)
                return True, "extended"

            return await asyncio.create_task(intruder())
        finally:
            await lock.arelease()

    held, said = asyncio.run(main())
    assert held is False
    assert "not acquired by task" in said


# --- 8. a forked child holds none of its parent's locks ----------------------------------------


def _in_a_forked_child(probe: Callable[[], dict[str, object]]) -> dict[str, object]:
    """Run ``probe`` in a child made by ``os.fork()`` (a real process); what it found."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running the parent's cleanup
        try:
            found = json.dumps(probe())
        except BaseException as exc:  # noqa: BLE001 (reported to the parent, which fails)
            found = json.dumps({"probe raised": repr(exc)})
        os.write(write, found.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        found = json.loads(pipe.read() or b"{}")
    os.waitpid(pid, 0)
    return found


def _outcome(call: Callable[[], object]) -> str:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 (the exception is the observation)
        return f"{type(exc).__name__}: {exc}"
    return "ok"


def test_a_forked_child_sees_everywhere_that_it_does_not_hold_its_parents_lock(masters, redlock_of):
    engine = redlock_of(masters)
    lock = engine.lock("forked", ttl=10, wait=0)
    lock.acquire()
    parent_value = [m.call("GET", lock.key) for m in masters]
    assert asyncio.run(lock.aowned())  # in the parent, the same probe finds it held

    def probe() -> dict[str, object]:
        return {
            "held": lock.held,
            "validity": lock.validity,
            "hold_count": lock.hold_count,
            "owned()": lock.owned(),
            "aowned()": asyncio.run(lock.aowned()),  # owner: this (main) thread, as it called
            "repr": repr(lock),
            "check()": _outcome(lock.check),
            "release()": _outcome(lock.release),
            "acquire() while the parent holds it": _outcome(lock.acquire),
        }

    found = _in_a_forked_child(probe)
    check, release, acquire = (
        found.pop("check()"),
        found.pop("release()"),
        found.pop("acquire() while the parent holds it"),
    )
    assert found == {
        "held": False,
        "validity": 0.0,
        "hold_count": 0,
        "owned()": False,
        "aowned()": False,
        "repr": "<Lock 'forked' unlocked>",
    }
    assert str(check).startswith("RuntimeError:")
    assert "forked child does not hold its parent's locks" in str(check)
    assert str(release).startswith("RuntimeError:")
    assert "forked child does not hold its parent's locks" in str(release)
    assert str(acquire).startswith("LockContended:")  # a real attempt, refused by the masters
    assert [m.call("GET", lock.key) for m in masters] == parent_value  # the child took nothing
    assert lock.held
    lock.release()


# --- 12. re-entry of part of a held lock --------------------------------------------------------


def test_a_lock_over_some_of_the_resources_held_reenters_their_lease(masters, redlock_of):
    engine = redlock_of(masters)
    pair = engine.lock("account:1", "account:2", ttl=10)
    start = time.monotonic()
    with pair:
        for part in (("account:1",), ("account:2",), ("account:2", "account:1")):
            with engine.lock(*part, ttl=10, wait=5, reentrant=True) as inner:
                assert inner.hold_count == 2
                assert inner.validity > 9
                assert inner.fences == {r: pair.fences[r] for r in part}
            assert pair.hold_count == 1
        assert engine.is_locked("account:1")
        assert engine.is_locked("account:2")
    assert time.monotonic() - start < 2  # never waited for ourselves
    assert not engine.is_locked("account:1")
    assert not engine.is_locked("account:2")


def test_the_decorated_helper_of_a_transfer_reenters_the_accounts_it_holds(masters, redlock_of):
    engine = redlock_of(masters)

    @engine.locked("account:{id}", ttl=10, wait=5, reentrant=True)
    def debit(id: int) -> bool:  # noqa: A002 (the name the template uses)
        return engine.is_locked(f"account:{id}")

    @engine.locked("account:{src}", "account:{dst}", ttl=10, wait=5)
    def transfer(src: int, dst: int) -> list[bool]:
        return [debit(src), debit(dst)]

    start = time.monotonic()
    assert transfer(1, 2) == [True, True]
    assert time.monotonic() - start < 2
    assert not engine.is_locked("account:1")


def test_a_lock_over_resources_held_in_part_is_refused_at_once_with_the_reason(masters, redlock_of):
    engine = redlock_of(masters)
    start = time.monotonic()
    with engine.lock("a", "b", ttl=10):
        with pytest.raises(LockContended, match="same thread/task.*reentrant=True"):
            engine.lock("a", ttl=10, wait=5).acquire()  # all of it held, but not re-entrant
        with pytest.raises(LockContended, match=r"holds 'a' \(through lock 'a \+ b'\) but not 'c'"):
            engine.lock("a", "c", ttl=10, wait=5, reentrant=True).acquire()
    with engine.lock("a", ttl=10):
        with pytest.raises(LockContended, match="holds 'a' \\(through lock 'a'\\) but not 'b'"):
            engine.lock("a", "b", ttl=10, wait=5, reentrant=True).acquire()
        with engine.lock("b", ttl=10):
            with pytest.raises(LockContended, match="through different locks \\('a' and 'b'\\)"):
                engine.lock("a", "b", ttl=10, wait=5, reentrant=True).acquire()
    assert time.monotonic() - start < 2  # each refused at once: waiting would be for ourselves
    assert not engine.is_locked("c")
    with engine.lock("a", "b", ttl=10, wait=0):  # and nothing was left behind
        pass


# --- 13. a shared re-entrant handle -------------------------------------------------------------


def test_a_shared_reentrant_handle_reenters_sync_and_async(masters, redlock_of):
    engine = redlock_of(masters)
    payments = engine.lock("payments", ttl=10, reentrant=True)
    other = engine.lock("payments", ttl=10, reentrant=True)
    with payments:
        with payments:
            with other, payments:
                assert payments.hold_count == 4
            assert payments.hold_count == 2
        assert payments.held
        assert engine.is_locked("payments")
    assert not payments.held
    assert not engine.is_locked("payments")

    async def main() -> list[object]:
        seen: list[object] = []
        async with payments:
            async with payments:
                seen.append(payments.hold_count)
            seen.append(await payments.aowned())
        seen.append(await engine.ais_locked("payments"))
        return seen

    assert asyncio.run(main()) == [2, True, False]


def test_a_shared_handle_that_is_not_reentrant_still_refuses_a_second_entry(masters, redlock_of):
    engine = redlock_of(masters)
    lock = engine.lock("payments", ttl=10)
    with lock, pytest.raises(RuntimeError, match="reentrant=True"):
        lock.acquire()
    assert not engine.is_locked("payments")


def test_a_shared_reentrant_handle_counts_each_owners_entries_apart(masters, redlock_of):
    engine = redlock_of(masters)
    payments = engine.lock("payments", ttl=10, wait=0, reentrant=True)
    seen: dict[str, object] = {}

    def other_thread(step: str) -> None:
        def attempt() -> None:
            seen[f"{step}: other thread"] = _outcome(lambda: payments.acquire().release())
            seen[f"{step}: its hold count"] = payments.hold_count

        thread = threading.Thread(target=attempt)
        thread.start()
        thread.join()

    with payments:
        with payments:
            other_thread("entered twice")
        other_thread("left once")
        seen["still mine"] = payments.hold_count
    other_thread("left")
    assert {step: str(found).split(":")[0] for step, found in seen.items()} == {
        "entered twice: other thread": "LockContended",
        "entered twice: its hold count": "0",
        "left once: other thread": "LockContended",  # still held: the outer entry remains
        "left once: its hold count": "0",
        "still mine": "1",
        "left: other thread": "ok",
        "left: its hold count": "0",
    }
