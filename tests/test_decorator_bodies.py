"""The function decorator (``@locked``) of issue 23: the lock covers the whole body of a generator
function, sync or async (items 2), and a template field may come from the ``**`` parameter
whatever its name (item 14). Real redis-server masters; the other client is a real one."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from django_redlock.engine import Lock, LockContended, LockLost

from .conftest import until_set, wait_until


def test_a_template_field_from_a_var_keyword_parameter_of_any_name(masters, redlock_of):
    engine = redlock_of(masters)
    seen: list[bool] = []

    @engine.locked("report:{user_id}", ttl=10)
    def report(**options: object) -> object:
        seen.append(engine.is_locked(f"report:{options['user_id']}"))
        return options["user_id"]

    assert report(user_id=7) == 7
    assert seen == [True]
    with engine.lock("report:8", ttl=10), pytest.raises(LockContended):
        report(user_id=8)  # the field named the right resource: the held one
    assert seen == [True]


# --- 2. a generator's body runs under the lock, however it is iterated ---------------------------


def test_a_decorated_generator_holds_the_lock_across_its_iteration(masters, redlock_of):
    engine, other = redlock_of(masters), redlock_of(masters)  # another client, its own engine

    def others_take() -> str:
        try:
            other.lock("feed:7", ttl=10, wait=0).acquire().release()
        except LockContended:
            return "contended"
        return "acquired"

    @engine.locked("feed:{feed}", ttl=10)
    def rows(feed: int) -> Iterator[str]:
        for row in ("a", "b", "c"):
            yield f"{row} while another client {others_take()}"
        return "done"

    generator = rows(7)
    assert others_take() == "acquired"  # made, not started: nothing held yet
    assert next(generator) == "a while another client contended"
    assert others_take() == "contended"  # suspended between items: still held
    assert list(generator) == [
        "b while another client contended",
        "c while another client contended",
    ]
    assert others_take() == "acquired"  # exhausted: released

    closed = rows(7)
    next(closed)
    closed.close()
    assert others_take() == "acquired"  # closed early: released

    def consume_elsewhere() -> None:  # a generator may be finished by another thread
        elsewhere.append(next(started))
        started.close()

    elsewhere: list[str] = []
    started = rows(7)
    next(started)
    thread = threading.Thread(target=consume_elsewhere)
    thread.start()
    thread.join()
    assert elsewhere == ["b while another client contended"]
    assert others_take() == "acquired"


def test_a_decorated_async_generator_holds_the_lock_and_never_blocks_the_loop(masters, redlock_of):
    engine, other = redlock_of(masters), redlock_of(masters)

    async def others_take() -> str:
        try:
            await (await other.lock("feed:7", ttl=10, wait=0).aacquire()).arelease()
        except LockContended:
            return "contended"
        return "acquired"

    @engine.locked("feed:{feed}", ttl=10)
    async def rows(feed: int) -> AsyncIterator[str]:
        for row in ("a", "b", "c"):
            try:
                received = yield f"{row} while another client {await others_take()}"
            except KeyError as error:
                received = f"thrown {error}"
            if received is not None:
                yield f"got {received}"

    async def main() -> dict[str, object]:
        seen: dict[str, object] = {"before": await others_take()}
        generator = rows(7)
        seen["first"] = await anext(generator)
        seen["between items"] = await others_take()
        seen["sent"] = await generator.asend("x")
        seen["next"] = await anext(generator)
        seen["thrown"] = await generator.athrow(KeyError("y"))
        seen["rest"] = [row async for row in generator]
        seen["exhausted"] = await others_take()
        async for _ in rows(7):
            break  # abandoned: asyncio's finalizer closes it, in a task of its own
        # Released once that task ran (when: up to a loaded machine), long before its 10 s TTL.
        deadline = time.monotonic() + 5
        while (after := await others_take()) != "acquired" and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        seen["after a break"] = after
        # Waiting for a holder on this same loop: a blocking acquire would stop the loop, and
        # the holder with it, until ``wait`` ran out.
        held = asyncio.Event()
        holder = asyncio.create_task(_hold_for(other.lock("feed:7", ttl=10, wait=5), 0.3, held))
        await until_set(held, holder)
        seen["waited for a holder on the loop"] = [row async for row in patient_rows(7)]
        await holder
        return seen

    @engine.locked("feed:{feed}", ttl=10, wait=5)
    async def patient_rows(feed: int) -> AsyncIterator[str]:
        yield f"feed {feed} while another client {await others_take()}"

    assert asyncio.run(main()) == {
        "before": "acquired",
        "first": "a while another client contended",
        "between items": "contended",
        "sent": "got x",
        "next": "b while another client contended",
        "thrown": "got thrown 'y'",
        "rest": ["c while another client contended"],
        "exhausted": "acquired",
        "after a break": "acquired",
        "waited for a holder on the loop": ["feed 7 while another client contended"],
    }


async def _hold_for(lock: Lock, seconds: float, held: asyncio.Event) -> None:
    async with lock:
        held.set()
        await asyncio.sleep(seconds)


def test_the_django_locked_decorator_holds_the_lock_across_a_generator(redlock_settings):
    from django_redlock import is_locked, locked

    @locked("export:{name}", ttl=10)
    def export(name: str) -> Iterator[bool]:
        yield is_locked(f"export:{name}")

    assert list(export("daily")) == [True]
    assert not is_locked("export:daily")


def test_lock_view_refuses_a_generator_function_when_decorating():
    from django_redlock.decorators import lock_view

    def rows(request: object) -> Iterator[bytes]:
        yield b"unlocked"

    async def arows(request: object) -> AsyncIterator[bytes]:
        yield b"unlocked"

    for view in (rows, arows):
        with pytest.raises(TypeError, match="a generator function is not a view"):
            lock_view("feed")(view)


def test_a_decorated_generator_whose_lease_ran_out_raises_lock_lost_when_it_ends(
    masters, redlock_of
):
    engine = redlock_of(masters)

    @engine.locked("slow", ttl=1.0)
    def slow() -> Iterator[int]:
        yield 1
        # Past the lease (another client may have held it since): it ran out on every master.
        key = engine.lock_key("slow")
        assert wait_until(lambda: all(m.call("EXISTS", key) == 0 for m in masters), 10)
        yield 2

    generator = slow()
    assert next(generator) == 1
    assert next(generator) == 2
    with pytest.raises(LockLost, match="was lost"):
        next(generator)
