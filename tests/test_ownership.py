"""Who holds a lease, as issue 23 found it misjudged: async queries inside task wrappers (item 9),
a forked child (item 8), re-entry of part of a held lock (item 12) and re-entry of a shared
handle (item 13). Real redis-server masters."""

from __future__ import annotations

import asyncio

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
                lock.alocked(), lock.aextend(), lock.afence(), several.afences()
            )
            waited = [
                await asyncio.wait_for(lock.alocked(), 5),
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
                    return await lock.alocked(), str(error)
                return True, "extended"

            return await asyncio.create_task(intruder())
        finally:
            await lock.arelease()

    held, said = asyncio.run(main())
    assert held is False
    assert "not acquired by task" in said
