"""The demo site (testproject.shop) through the test client, on real masters.

Concurrent requests are real threads, each with its own database connection to the test's shared
in-memory SQLite database. The locked paths must keep their invariant exactly; the unlocked
ones are not asserted to break (a run may happen to interleave harmlessly).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from django.db import connection
from django.db.models import Sum
from django.test import Client

from testproject.shop.models import Account, Show, Ticket
from testproject.shop.views import DEMO_ACCOUNTS, ensure_accounts, ensure_shows

ROOT = Path(__file__).resolve().parent.parent


def at_once(count: int, request: Callable[[Client, int], int]) -> list[int]:
    """``count`` threads, each sending one request as soon as all are ready; their statuses."""
    ready = threading.Barrier(count)
    statuses: list[int] = []

    def one(i: int) -> None:
        client = Client()
        ready.wait(10)
        try:
            statuses.append(request(client, i))
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return statuses


def total_balance() -> int:
    return Account.objects.aggregate(total=Sum("balance"))["total"]


@pytest.mark.django_db
def test_pages_render(redlock_settings: list) -> None:
    client = Client()
    index = client.get("/")
    assert index.status_code == 200
    assert b'id="total" class="good">3000<' in index.content
    assert b"nightly_report" in index.content  # points at the guarded command
    seats = client.get("/seats/")
    assert seats.status_code == 200
    assert b"Matinee" in seats.content
    assert b"lock_view" in seats.content
    metrics = client.get("/metrics/")
    assert metrics.status_code == 200
    assert b"redlock_acquire_wait_seconds" in metrics.content


@pytest.mark.django_db(transaction=True)
def test_concurrent_locked_transfers_keep_the_total(redlock_settings: list) -> None:
    ensure_accounts()
    statuses = at_once(12, lambda c, i: c.post("/transfer/").status_code)
    assert statuses == [200] * 12
    assert total_balance() == sum(DEMO_ACCOUNTS.values())
    balances = sorted(Account.objects.values_list("balance", flat=True))
    assert balances != [1000, 1000, 1000]  # money did move


@pytest.mark.django_db(transaction=True)
def test_concurrent_locked_bookings_never_sell_a_seat_twice(redlock_settings: list) -> None:
    ensure_shows()
    # One show: bookings of two shows would run in parallel (two locks), and the shared
    # in-memory SQLite of the tests refuses concurrent writers instead of queueing them.
    matinee = Show.objects.get(name="Matinee")
    statuses = at_once(16, lambda c, i: c.post(f"/seats/{matinee.pk}/book/").status_code)
    assert statuses == [200] * 16
    seats = sorted(Ticket.objects.filter(show=matinee).values_list("seat", flat=True))
    assert seats == list(range(1, 17))  # 16 tickets, 16 different seats: none sold twice
    page = Client().get("/seats/").content
    assert b'class="bad"' not in page


@pytest.mark.django_db
def test_booking_a_full_show_answers_409(redlock_settings: list) -> None:
    show = Show.objects.create(name="Tiny", seats=2)
    client = Client()
    assert [client.post(f"/seats/{show.pk}/book/").status_code for _ in range(3)] == [200, 200, 409]
    assert client.get(f"/seats/{show.pk}/book/").status_code == 405  # POST only, before locking
    assert client.post("/seats/999/book/").status_code == 404


@pytest.mark.django_db
def test_unsafe_paths_and_resets_work(redlock_settings: list) -> None:
    client = Client()
    ensure_shows()
    show = Show.objects.first()
    assert show is not None
    assert client.post(f"/seats/{show.pk}/book/unsafe/").json() == {"ok": True, "seat": 1}
    assert client.post("/transfer/?unsafe=1").json() == {"ok": True, "locked": False}
    assert client.post("/seats/reset/").json() == {"ok": True}
    assert client.post("/reset/").json() == {"ok": True}
    assert Ticket.objects.count() == 0
    assert total_balance() == 3000


def test_demo_command_starts_everything_and_says_how_to_run_the_guarded_command(
    tmp_path: Path,
) -> None:
    """``manage.py demo`` (the README's command): masters, migrations, admin, runserver, and
    the printed lines. Stopped with SIGINT, as Ctrl-C would."""
    from django_redlock.testing.masters import free_port

    port = free_port()
    env = {**os.environ, "REDLOCK_DEMO_DIR": str(tmp_path / "demo")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "demo", "--port", str(port), "--masters", "3"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not any("Ctrl-C" in line for line in lines):
            line = proc.stdout.readline()
            assert line, f"demo exited early: {''.join(lines)}"
            lines.append(line)
        printed = "".join(lines)
        assert f"http://127.0.0.1:{port}/seats/" in printed
        assert "password" in printed
        assert "nightly_report" in printed
        assert "redlock_run -- " in printed
        assert "export REDLOCK_NODES=redis://127.0.0.1:" in printed
        page = get_when_up(f"http://127.0.0.1:{port}/seats/")
        assert b"Matinee" in page
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
    assert proc.returncode is not None


def get_when_up(url: str, timeout: float = 30) -> bytes:
    """GET ``url`` (loopback), retrying while runserver is still starting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 (loopback)
                return response.read()  # type: ignore[no-any-return]
        except (ConnectionError, urllib.error.URLError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
