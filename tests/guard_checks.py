"""What the DB guard must do for an async acquisition, written once and run on each database:
in the test process on SQLite (tests/test_dbguard.py), and in a child process on a throwaway
PostgreSQL cluster:

    python -m tests.guard_checks    (REDLOCK_NODES, REDLOCK_TEST_PG=<port> in the environment)

prints ``OK <check>`` per check that held, then ``DONE``; a failed check raises.

The lease belongs to the task that *calls* ``aacquire()`` (the engine binds the owner then), and
so does the guard: ``wait_for``, ``gather``, ``create_task`` and ``shield`` run the acquisition in
a child task whose context is thrown away, and the caller's queries must still be refused once
the lease is over.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()

from asgiref.sync import async_to_sync, sync_to_async  # noqa: E402
from django.db import transaction  # noqa: E402
from django.db.models import F  # noqa: E402

from django_redlock import LockLost, LockNotAcquired, dbguard, redlock  # noqa: E402
from tests.fencedapp.models import Ledger  # noqa: E402

#: The lease: 1 s, so that an acquisition, and a release within the lease, are done in time on
#: a loaded machine (0.3 s left them 0.3 s). Every pause below outlives it: its validity is
#: counted from before the acquisition, the pause from after, and load only makes a pause longer.
TTL = 1.0
PAUSE = TTL + 0.1

#: The ways to run ``lock.aacquire()``: each but ``timeout`` in a child task.
FORMS = ["wait_for", "gather", "create_task", "shield", "timeout"]


async def acquire_through(form: str, lock: Any) -> None:
    if form == "wait_for":
        await asyncio.wait_for(lock.aacquire(), 5)
    elif form == "gather":
        await asyncio.gather(lock.aacquire())
    elif form == "create_task":
        await asyncio.create_task(lock.aacquire())
    elif form == "shield":
        await asyncio.shield(lock.aacquire())
    else:
        async with asyncio.timeout(5):
            await lock.aacquire()


def row(name: str) -> Any:
    """The ledger row ``name``, back at value 0."""
    return Ledger.objects.update_or_create(name=name, defaults={"value": 0, "fence": 0})[0]


def value(name: str) -> int:
    return int(Ledger.objects.get(name=name).value)


def entries() -> int:
    """How many entries guard the current context's queries."""
    return len(dbguard._guarded.get())


def check_an_acquisition_in_a_child_task_guards_the_caller() -> None:
    """After the lease ran out, the caller's UPDATE through sync_to_async is refused."""
    for form in FORMS:
        name = f"guarded-{form}"
        row(name)

        async def stale_write(form: str = form, name: str = name) -> None:
            lock = redlock(f"ledger:{name}", ttl=TTL)
            await acquire_through(form, lock)
            try:
                await asyncio.sleep(PAUSE)  # paused past the lease
                await Ledger.objects.filter(name=name).aupdate(value=9)
            finally:
                with contextlib.suppress(LockLost):
                    await lock.arelease()

        refused: list[str] = []
        try:
            async_to_sync(stale_write)()
        except LockLost as error:
            refused.append(str(error))
        assert refused, f"{form}: the stale UPDATE was not refused"
        assert "refused before it reached the database" in refused[0], (form, refused)
        assert value(name) == 0, form


def check_a_holder_through_a_child_task_writes_and_leaves_no_entry_behind() -> None:
    for form in FORMS:
        name = f"holder-{form}"
        row(name)

        async def write(form: str = form, name: str = name) -> tuple[int, int, int]:
            before = entries()
            lock = redlock(f"ledger:{name}", ttl=5)
            await acquire_through(form, lock)
            held = entries()
            await Ledger.objects.filter(name=name).aupdate(value=F("value") + 1)
            await lock.arelease()
            return before, held, entries()

        before, held, after = async_to_sync(write)()
        assert (held, after) == (before + 1, before), (form, before, held, after)
        assert value(name) == 1, form


def check_failed_acquisitions_in_child_tasks_leave_no_entries_behind() -> None:
    """An entry whose acquisition ended without a lease is dropped at the next call: a task
    that keeps trying through ``wait_for`` does not pile them up."""

    async def keep_trying() -> tuple[int, int]:
        before = entries()
        async with redlock("ledger:busy", ttl=5):
            for _ in range(20):
                with contextlib.suppress(LockNotAcquired):
                    await asyncio.wait_for(redlock("ledger:busy", wait=0).aacquire(), 5)
        return before, entries()

    before, after = async_to_sync(keep_trying)()
    assert after <= before + 1, (before, after)  # at most the last attempt's, guarding nothing


def check_a_child_task_that_acquires_for_itself_guards_only_itself() -> None:
    """``async with lock`` inside a task made with ``create_task``: the task is the owner and
    the guard is its own; the task that made it is not guarded by it."""
    name = "own-task"
    row(name)

    async def parent() -> None:
        held = asyncio.Event()

        async def child() -> None:
            async with redlock(f"ledger:{name}", ttl=TTL):
                held.set()
                await asyncio.sleep(PAUSE)

        task = asyncio.create_task(child())
        await held.wait()
        await asyncio.sleep(PAUSE)  # the child's lease ran out; the parent holds nothing
        await Ledger.objects.filter(name=name).aupdate(value=5)
        try:
            await task
        except LockLost:
            pass  # the child's own block: its lease was lost inside it
        else:
            raise AssertionError("the child's block did not report its lease lost")

    async_to_sync(parent)()
    assert value(name) == 5


def check_on_commit_callbacks_after_the_release_are_not_refused() -> None:
    """A lock acquired and released through child tasks leaves its released lease in the
    caller's context (the child's unguard cannot reach it); once its validity ran out too, a
    transaction and its on_commit callbacks still run: a released lease refuses nothing."""
    name = "on-commit"
    row(name)

    def commit_with_a_callback() -> None:
        with transaction.atomic():
            Ledger.objects.filter(name=name).update(value=1)
            transaction.on_commit(
                lambda: Ledger.objects.filter(name=name).update(value=F("value") + 1)
            )

    async def released_then_commit() -> None:
        lock = redlock(f"ledger:{name}", ttl=TTL)
        await asyncio.wait_for(lock.aacquire(), 5)
        await asyncio.wait_for(lock.arelease(), 5)
        await asyncio.sleep(PAUSE)  # the released lease's validity is over as well
        await sync_to_async(commit_with_a_callback)()

    async_to_sync(released_then_commit)()
    assert value(name) == 2

    with redlock(f"ledger:{name}", ttl=5), transaction.atomic():
        transaction.on_commit(lambda: Ledger.objects.filter(name=name).update(value=3))
    assert value(name) == 3


CHECKS: list[Callable[[], None]] = [
    check_an_acquisition_in_a_child_task_guards_the_caller,
    check_a_holder_through_a_child_task_writes_and_leaves_no_entry_behind,
    check_failed_acquisitions_in_child_tasks_leave_no_entries_behind,
    check_a_child_task_that_acquires_for_itself_guards_only_itself,
    check_on_commit_callbacks_after_the_release_are_not_refused,
]


def main() -> None:
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", run_syncdb=True, verbosity=0)
    print("VENDOR", connection.vendor, flush=True)
    for check in CHECKS:
        check()
        print("OK", check.__name__, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
