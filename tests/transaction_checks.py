"""Held until the transaction ends (``django_redlock.transactions``), written once and run on
each database, in a child process each (tests/test_transactions.py): on SQLite (a file, so that
threads share it) and on a throwaway PostgreSQL cluster::

    python -m tests.transaction_checks [check ...]
        (REDLOCK_NODES, and REDLOCK_TEST_PG=<port> or REDLOCK_TEST_DB=<file>, in the environment)

prints ``OK <check>`` per check that held, then ``DONE``; a failed check raises. Each check
fails on the code before locks waited for their transaction (531ce3f).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django
    from django.conf import settings

    settings.ROOT_URLCONF = "tests.transaction_urls"
    django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402
from django.test import Client  # noqa: E402

from django_redlock import LockLost, LockNotAcquired, is_locked, locked, redlock  # noqa: E402
from django_redlock import transactions as waiting  # noqa: E402
from django_redlock.commands import guard_command  # noqa: E402
from django_redlock.transactions import CommitRefused  # noqa: E402
from tests.fencedapp.models import Ledger  # noqa: E402
from tests.transaction_tasks import Command  # noqa: E402

THREADS, POSTS = 6, 6


def value(name: str) -> int:
    return Ledger.objects.get(name=name).value


@contextmanager
def atomic_requests(on: bool = True) -> Iterator[None]:
    """``ATOMIC_REQUESTS`` for the default database (read per request, from the settings dict
    every thread's connection shares)."""
    settings_dict = connections.settings["default"]
    before = settings_dict.get("ATOMIC_REQUESTS", False)
    settings_dict["ATOMIC_REQUESTS"] = on
    try:
        yield
    finally:
        settings_dict["ATOMIC_REQUESTS"] = before


def in_threads(work: Callable[[], None], threads: int = THREADS) -> list[BaseException]:
    """Run ``work`` in ``threads`` threads at once; what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run() -> None:
        try:
            start.wait()
            work()
        except BaseException as error:  # noqa: BLE001 (reported by the check)
            errors.append(error)
        finally:
            connection.close()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    return errors


def held_elsewhere(resource: str) -> bool:
    """Whether the masters say ``resource`` is held (asked from another thread: the answer must
    not depend on who asks)."""
    answer: list[bool] = []
    thread = threading.Thread(target=lambda: answer.append(is_locked(resource)))
    thread.start()
    thread.join(30)
    return answer[0]


def posts(path: str, name: str) -> list[int]:
    """``THREADS`` threads posting ``POSTS`` times each to ``path``: the status codes."""
    statuses: list[int] = []

    def post() -> None:
        client = Client(raise_request_exception=False)
        for _ in range(POSTS):
            statuses.append(client.post(f"/{path}/{name}/").status_code)

    errors = in_threads(post)
    assert not errors, errors
    return statuses


# --- the checks ----------------------------------------------------------------------------------


def check_lock_view_under_atomic_requests_loses_no_update() -> None:
    Ledger.objects.create(name="view")
    with atomic_requests():
        statuses = posts("count", "view")
    assert statuses == [200] * THREADS * POSTS, statuses
    assert value("view") == THREADS * POSTS, f"{THREADS * POSTS - value('view')} updates lost"
    assert not waiting.holds, waiting.holds


def check_redlock_inside_an_outer_atomic_loses_no_update() -> None:
    Ledger.objects.create(name="outer")

    def increments() -> None:
        for _ in range(POSTS):
            with transaction.atomic():  # a caller's transaction, around a service function
                with redlock("count:outer", wait=30):
                    row = Ledger.objects.get(name="outer")
                    time.sleep(0.02)
                    row.value += 1
                    row.save()

    errors = in_threads(increments)
    assert not errors, errors
    assert value("outer") == THREADS * POSTS, f"{THREADS * POSTS - value('outer')} lost"


def check_the_lock_is_held_until_the_commit_then_released() -> None:
    Ledger.objects.create(name="held")
    with transaction.atomic():
        with redlock("txn:held") as lock:
            Ledger.objects.filter(name="held").update(value=1)
        assert held_elsewhere("txn:held"), "released before the commit"
        assert not lock.held  # the block is over: the handle no longer speaks for it
        assert [lease.resource for lease in waiting.waiting()] == ["txn:held"]
    assert not held_elsewhere("txn:held"), "still held after the commit"
    assert not waiting.holds
    assert value("held") == 1


def check_a_rollback_frees_the_lock() -> None:
    Ledger.objects.create(name="rolled")
    try:
        with transaction.atomic():
            with redlock("txn:rolled"):
                Ledger.objects.filter(name="rolled").update(value=7)
            assert held_elsewhere("txn:rolled")
            raise RuntimeError("the caller fails after the lock's block")
    except RuntimeError:
        pass
    assert not held_elsewhere("txn:rolled"), "leaked after the rollback"
    assert not waiting.holds
    assert value("rolled") == 0


def check_only_the_outermost_transaction_counts() -> None:
    Ledger.objects.create(name="nested")
    with transaction.atomic():
        try:
            with transaction.atomic():  # a savepoint: rolled back, the lock stays held
                with redlock("txn:nested"):
                    Ledger.objects.filter(name="nested").update(value=5)
                raise RuntimeError("inner")
        except RuntimeError:
            pass
        assert held_elsewhere("txn:nested"), "released by a savepoint's rollback"
        with transaction.atomic():  # a savepoint released: no commit yet
            with redlock("txn:nested"):  # taken again by its holder: no wait for itself
                Ledger.objects.filter(name="nested").update(value=6)
        assert held_elsewhere("txn:nested"), "released by a savepoint's release"
    assert not held_elsewhere("txn:nested")
    assert value("nested") == 6
    assert not waiting.holds


def check_every_connection_inside_a_transaction_is_waited_for() -> None:
    other = dict(connections.settings["default"])
    if connection.vendor == "sqlite":
        other["NAME"] = f"{other['NAME']}-other"
    connections.settings["other"] = other
    try:
        with transaction.atomic(using="other"):
            with transaction.atomic():
                with redlock("txn:two"):
                    pass
            assert held_elsewhere("txn:two"), "released when only one of its transactions ended"
        assert not held_elsewhere("txn:two"), "still held after both transactions ended"
        assert not waiting.holds
    finally:
        connections["other"].close()


def check_the_same_thread_takes_its_waiting_locks_again_without_waiting_for_itself() -> None:
    lock = redlock("txn:again", wait=0)
    with transaction.atomic():
        lock.acquire()
        lock.release()  # waits for the transaction, as the end of a block does
        lock.acquire()  # the same handle: the waiting lease, held again (no round, no wait)
        lock.release()
        with redlock("txn:again", wait=0):  # another handle
            pass
        with redlock("txn:permit", limit=1, wait=0):
            pass
        with redlock("txn:permit", limit=1, wait=0):  # its only permit: the waiting one
            pass
        with redlock("txn:rw", shared=True, wait=0):  # a reader: released at its block's end
            pass
        with redlock("txn:rw", wait=0):  # so its writer is free for the same thread
            pass
        assert held_elsewhere("txn:again")
        assert len(waiting.waiting()) == 3, waiting.waiting()  # "again", the permit, "rw"
    assert not waiting.holds
    assert not held_elsewhere("txn:again")
    assert not held_elsewhere("txn:rw")
    assert taken_elsewhere("txn:permit", limit=1), "the permit is still taken"


def taken_elsewhere(resource: str, **options: Any) -> bool:
    """Whether another thread can take ``resource`` at once."""
    taken: list[bool] = []

    def take() -> None:
        try:
            with redlock(resource, wait=0, **options):
                taken.append(True)
        except LockNotAcquired:
            taken.append(False)

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(30)
    return taken[0]


def check_the_status_command_and_the_admin_show_a_lock_held_until_its_transaction_ends() -> None:
    from io import StringIO

    from django.contrib.auth.models import User

    admin = User.objects.create_superuser("txn-admin", password="pw")
    client = Client()
    client.force_login(admin)
    with transaction.atomic():
        with redlock("txn:shown", label="shown here"):
            pass
        shown: list[str] = []

        def look() -> None:  # from another thread, as another process would: the masters' word
            out = StringIO()
            call_command("redlock_status", stdout=out)
            shown.append(out.getvalue())
            shown.append(client.get("/admin/django_redlock/heldlock/").content.decode())
            connection.close()

        thread = threading.Thread(target=look)
        thread.start()
        thread.join(60)
    status, page = (" ".join(text.split()) for text in shown)  # (the status wraps lines)
    assert "label 'shown here' (held until its transaction ends)" in status, status
    assert "label &#x27;shown here&#x27; (held until its transaction ends)" in page, page
    with redlock("txn:shown", label="outside"):  # outside a transaction: not said
        out = StringIO()
        call_command("redlock_status", stdout=out)
    status = " ".join(out.getvalue().split())
    assert "label 'outside' since" in status, status
    User.objects.filter(pk=admin.pk).delete()


def check_a_transaction_left_open_by_a_thread_that_ended_is_bounded_by_the_lease() -> None:
    import gc

    leases = []

    def leaves_its_transaction_open() -> None:
        transaction.atomic().__enter__()  # never left: the thread ends inside it
        with redlock("txn:abandoned", ttl=1.0, auto_extend=True):
            pass
        leases.extend(waiting.waiting())

    thread = threading.Thread(target=leaves_its_transaction_open)
    thread.start()
    thread.join(30)
    (lease,) = leases
    del thread
    assert lease in waiting.holds
    wait_for(lambda: gc.collect() is not None and lease not in waiting.holds, "the finalizer")
    assert lease.auto_extend is False, "still renewed after its connection was dropped"
    wait_for(lambda: not held_elsewhere("txn:abandoned"), "the lease to run out")


def check_release_before_commit_restores_the_old_hazard() -> None:
    Ledger.objects.create(name="early")
    with transaction.atomic():
        with redlock("txn:early", release_before_commit=True):
            Ledger.objects.filter(name="early").update(value=1)
        assert not held_elsewhere("txn:early"), "held although release_before_commit=True"
    with atomic_requests():
        statuses = [Client().post("/count-early/early/").status_code for _ in range(2)]
    assert statuses == [200, 200]
    assert not waiting.holds


def check_a_commit_after_the_lease_ran_out_is_refused() -> None:
    Ledger.objects.create(name="late")
    refused: list[CommitRefused] = []
    try:
        with transaction.atomic():
            with redlock("txn:late", ttl=1.0):
                Ledger.objects.filter(name="late").update(value=9)
            # The caller is slow after the lock's block: the lease (not renewed) runs out.
            wait_for(lambda: lease_ran_out("txn:late"), "the lease to run out")
    except CommitRefused as error:
        refused.append(error)
    assert refused, "a commit after the lease ran out was not refused"
    assert "rolled back instead of committed" in str(refused[0])
    assert isinstance(refused[0], LockLost)
    assert value("late") == 0, "the refused transaction was committed"
    assert not connection.in_atomic_block
    assert not waiting.holds
    with redlock("txn:late", wait=0):  # nothing left behind
        pass


def lease_ran_out(resource: str) -> bool:
    return any(lease.check_lost() for lease in waiting.waiting() if lease.resource == resource)


def check_a_waiting_auto_extended_lease_is_renewed_and_its_loss_refuses_the_commit() -> None:
    Ledger.objects.create(name="renewed")
    refused: list[CommitRefused] = []
    try:
        with transaction.atomic():
            with redlock("txn:renewed", ttl=1.0, auto_extend=True):
                Ledger.objects.filter(name="renewed").update(value=2)
            time.sleep(2.5)  # past two leases: the waiting lock is renewed meanwhile
            assert held_elsewhere("txn:renewed"), "a waiting auto-extended lock ran out"
            (lease,) = waiting.waiting()
            force_release("txn:renewed")  # an operator takes it away before our commit
            wait_for(lambda: lease.lost, "the renewal to find the lease gone")
    except CommitRefused as error:
        refused.append(error)
    assert refused, "a commit after the lease was lost was not refused"
    assert value("renewed") == 0
    assert not waiting.holds


def force_release(resource: str) -> None:
    import redis

    from django_redlock.conf import get_redlock

    engine = get_redlock()
    for url in settings_nodes():
        redis.Redis.from_url(url).delete(engine.lock_key(resource))


def settings_nodes() -> list[str]:
    from django.conf import settings

    return list(settings.REDLOCK["NODES"])


def wait_for(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}")
        time.sleep(0.02)


def check_locked_and_guarded_commands_wait_for_the_transaction() -> None:
    @locked("txn:service:{n}")
    def service(n: int) -> None:
        Ledger.objects.filter(name="service").update(value=n)

    Ledger.objects.create(name="service")
    with transaction.atomic():
        service(3)
        assert held_elsewhere("txn:service:3"), "@locked released before the commit"
        with guard_command("txn-guarded"):
            Ledger.objects.filter(name="service").update(value=4)
        assert held_elsewhere("command:txn-guarded"), "guard_command released before commit"
        call_command(Command(), verbosity=0)
        assert held_elsewhere("command:transaction_tasks"), "the guarded command released"
        with guard_command("txn-guarded"):  # a second run in the same transaction: no wait
            pass
    for resource in ("txn:service:3", "command:txn-guarded", "command:transaction_tasks"):
        assert not held_elsewhere(resource), resource
    assert value("service") == 4
    assert not waiting.holds


def check_a_celery_task_called_inside_a_transaction_waits_for_it() -> None:
    from tests.transaction_tasks import bump

    Ledger.objects.create(name="task")
    with transaction.atomic():
        assert bump("task") == "bumped"
        assert held_elsewhere("bump:task"), "the task's run lock released before the commit"
    assert not held_elsewhere("bump:task")
    assert value("task") == 1
    assert not waiting.holds


CHECKS: list[Callable[[], None]] = [
    check_lock_view_under_atomic_requests_loses_no_update,
    check_redlock_inside_an_outer_atomic_loses_no_update,
    check_the_lock_is_held_until_the_commit_then_released,
    check_a_rollback_frees_the_lock,
    check_only_the_outermost_transaction_counts,
    check_every_connection_inside_a_transaction_is_waited_for,
    check_the_same_thread_takes_its_waiting_locks_again_without_waiting_for_itself,
    check_the_status_command_and_the_admin_show_a_lock_held_until_its_transaction_ends,
    check_a_transaction_left_open_by_a_thread_that_ended_is_bounded_by_the_lease,
    check_release_before_commit_restores_the_old_hazard,
    check_a_commit_after_the_lease_ran_out_is_refused,
    check_a_waiting_auto_extended_lease_is_renewed_and_its_loss_refuses_the_commit,
    check_locked_and_guarded_commands_wait_for_the_transaction,
    check_a_celery_task_called_inside_a_transaction_waits_for_it,
]


def main(names: list[str]) -> None:
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)
    print("VENDOR", connection.vendor, flush=True)
    for check in CHECKS:
        if names and check.__name__ not in names:
            continue
        Ledger.objects.all().delete()
        check()
        print("OK", check.__name__, flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
