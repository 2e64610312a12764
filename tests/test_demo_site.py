"""The demo site (testproject.shop) through the test client, on real masters.

Concurrent requests are real threads, each with its own database connection to the test's shared
in-memory SQLite database. The locked paths must keep their invariant exactly; the unlocked
ones are not asserted to break (a run may happen to interleave harmlessly).
"""

from __future__ import annotations

import os
import re
import signal
import socket
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
from tests.conftest import manage_py
from tests.test_admin_browser import browser_page

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
    balances = client.get("/balances/").json()
    assert balances == {"accounts": DEMO_ACCOUNTS, "total": 3000}
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


class Demo:
    """``manage.py demo`` in a session of its own, read until it has printed its URLs."""

    def __init__(self, demo_dir: Path, port: int) -> None:
        env = {**os.environ, "REDLOCK_DEMO_DIR": str(demo_dir)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env.pop("REDLOCK_NODES", None)
        self.port = port
        self.proc = subprocess.Popen(  # noqa: S603
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "demo",
                "--port",
                str(port),
                "--masters",
                "3",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def printed(self) -> str:
        """Everything up to the line that says how to stop it (fails if it exits before)."""
        assert self.proc.stdout is not None
        lines: list[str] = []
        while not any("Ctrl-C" in line for line in lines):
            line = self.proc.stdout.readline()
            assert line, f"demo exited early: {''.join(lines)}"
            lines.append(line)
        return "".join(lines)

    def stop(self, sig: int = signal.SIGINT, *, group: bool = True) -> int:
        (os.killpg if group else os.kill)(self.proc.pid, sig)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def master_ports(printed: str) -> list[int]:
    return [int(p) for p in re.findall(r"redis://127\.0\.0\.1:(\d+)/0", printed.split("\n")[1])]


def test_demo_command_starts_everything_and_says_how_to_run_the_guarded_command(
    tmp_path: Path,
) -> None:
    """``manage.py demo`` (the README's command): masters, migrations, admin, runserver, and
    the printed lines. Stopped with SIGINT, as Ctrl-C would."""
    from django_redlock.testing.masters import free_port

    demo = Demo(tmp_path / "demo", free_port())
    try:
        printed = demo.printed()
        assert f"http://127.0.0.1:{demo.port}/seats/" in printed
        assert "password" in printed
        assert "nightly_report" in printed
        assert "redlock_run -- " in printed
        page = get_when_up(f"http://127.0.0.1:{demo.port}/seats/")
        assert b"Matinee" in page
    finally:
        demo.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_kill_or_a_closed_terminal_stops_everything_the_demo_started(
    tmp_path: Path, sig: int
) -> None:
    """Was: the demo died at once and left its redis-servers and runserver behind, holding the
    port. Now SIGTERM (kill) and SIGHUP (the terminal closed) stop it as Ctrl-C does. The signal
    goes to the demo process alone: the hardest case, nothing else is told."""
    from django_redlock.testing.masters import free_port
    from testproject.shop.management.commands.demo import CHILDREN

    demo = Demo(tmp_path / "demo", free_port())
    try:
        ports = master_ports(demo.printed())
        get_when_up(f"http://127.0.0.1:{demo.port}/")
        assert len(ports) == 3
        assert all(listening(p) for p in [*ports, demo.port])
        # What a next demo would stop after a kill -9: 3 masters and runserver.
        assert len((tmp_path / "demo" / CHILDREN).read_text().split()) == 4
    finally:
        code = demo.stop(sig, group=False)
    assert code == 0
    assert not any(listening(p) for p in [*ports, demo.port])
    assert not (tmp_path / "demo" / "demo.pid").exists()


def test_a_second_demo_refuses_and_the_printed_commands_work_as_pasted(tmp_path: Path) -> None:
    """A second demo (same port, or same directory) exits non-zero and changes nothing of the
    running one's; the commands the first printed run as pasted in a bare new shell, and see a
    healthy setup (durable masters: no persistence warning)."""
    from django_redlock.testing.masters import free_port

    demo_dir = tmp_path / "demo"
    demo = Demo(demo_dir, free_port())
    try:
        printed = demo.printed()
        get_when_up(f"http://127.0.0.1:{demo.port}/")
        database = demo_dir / "demo.sqlite3"
        before = (database.stat().st_mtime_ns, (demo_dir / "demo.pid").read_text())
        env = {**os.environ, "REDLOCK_DEMO_DIR": str(demo_dir)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        second = [sys.executable, str(ROOT / "manage.py"), "demo", "--masters", "1"]
        same_port = subprocess.run(  # noqa: S603
            [*second, "--port", str(demo.port)],
            env={**env, "REDLOCK_DEMO_DIR": str(tmp_path / "other")},
            capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
        )  # fmt: skip
        same_dir = subprocess.run(  # noqa: S603
            [*second, "--port", str(free_port())],
            env=env, capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
        )  # fmt: skip
        after = (database.stat().st_mtime_ns, (demo_dir / "demo.pid").read_text())
        status_line = next(line for line in printed.splitlines() if "status  :" in line)
        bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        pasted = subprocess.run(  # noqa: S603
            ["/bin/bash", "-c", status_line.split(":", 1)[1]],
            env=bare, cwd="/", capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    finally:
        demo.stop()
    assert same_port.returncode == 1
    assert f"port {demo.port} is taken" in same_port.stderr
    assert "nothing changed" in same_port.stderr
    assert not (tmp_path / "other").exists()
    assert same_dir.returncode == 1
    assert "is running from" in same_dir.stderr
    assert after == before
    assert pasted.returncode == 0, pasted.stderr
    assert "3 of 3 masters reachable, quorum 2: OK" in pasted.stdout
    assert "appendonly" not in pasted.stdout.split("Held locks")[0].replace("AOF", "")


def test_the_demos_refused_nightly_report_says_so_once(
    redlock_settings: list, tmp_path: Path
) -> None:
    """Was: the refusal twice, once as the demo's INFO log line of the contended lock."""
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "testproject.settings",
        "REDLOCK_NODES": ",".join(m.url for m in redlock_settings),
        "REDLOCK_DEMO_DIR": str(tmp_path),
    }
    first = subprocess.Popen(  # noqa: S603
        [sys.executable, str(ROOT / "manage.py"), "nightly_report", "--seconds", "30"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert first.stdout is not None
        assert "working for" in first.stdout.readline()  # it holds the lock now
        second = manage_py("nightly_report", "--seconds", "0", env=env)
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 75, second.stderr
    assert "nightly_report not started" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr


def test_a_port_left_in_time_wait_is_free_for_the_next_demo(tmp_path: Path) -> None:
    """Was: "port 8000 is taken" right after a demo stopped, with only TIME-WAIT sockets left
    (the probe bound without SO_REUSEADDR, which runserver uses)."""
    from testproject.shop.management.commands.demo import refuse_if_in_use

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = server.accept()
            accepted.close()  # the server closes first: its side goes to TIME-WAIT
            client.recv(1)
    assert f"127.0.0.1:{port} " in _time_wait_sockets()  # the state the probe met
    refuse_if_in_use(port, tmp_path)  # no CommandError


def _time_wait_sockets() -> str:
    """Local addresses of this host's TCP sockets in TIME-WAIT (state 06 in /proc/net/tcp)."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "06":
            host, port = local.split(":")
            found.append(f"{socket.inet_ntoa(bytes.fromhex(host)[::-1])}:{int(port, 16)} ")
    return "".join(found)


def test_what_a_killed_demo_left_running_is_stopped_by_the_next(tmp_path: Path) -> None:
    """Was: ``kill -9`` of the demo left its redis-servers and runserver serving, and the next
    demo started beside them. The demo notes its children's pids (see the test below); the next
    one stops those that are still ours, and spares a pid now used by another program."""
    from django_redlock.testing.masters import LocalMaster
    from testproject.shop.management.commands.demo import CHILDREN, _alive, stop_leftovers

    master = LocalMaster(tmp_path / "master").start()
    runserver = subprocess.Popen(  # noqa: S603 (stands for the demo's runserver)
        [sys.executable, "-c", "import time; time.sleep(60)", "runserver", "--noreload"]
    )
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # noqa: S603
    try:
        assert master.proc is not None
        pids = [master.proc.pid, runserver.pid, stranger.pid]
        (tmp_path / CHILDREN).write_text("".join(f"{pid}\n" for pid in pids))
        stopped = stop_leftovers(tmp_path)
        assert runserver.wait(5) == -signal.SIGKILL
        assert master.proc.wait(5) == -signal.SIGKILL
        assert len(stopped) == 2
        assert _alive(stranger.pid)  # not ours: left alone
        assert not (tmp_path / CHILDREN).exists()
    finally:
        for proc in (runserver, stranger):
            proc.kill()
            proc.wait()
        master.kill()


@pytest.mark.django_db(transaction=True)
def test_the_money_page_says_what_each_run_did_in_a_real_browser(
    live_server, redlock_settings: list
) -> None:
    """Was: after an unlocked run broke the total, a locked run that changed nothing still looked
    red. Each run now gets a line with the total before and after it, green when unchanged."""
    ensure_accounts()
    Account.objects.filter(name="alice").update(balance=990)  # as an unlocked run might leave it
    with browser_page() as page:
        from playwright.sync_api import expect  # installed: browser_page checked

        page.goto(f"{live_server.url}/")
        page.get_by_text("20 concurrent transfers, locked").click()
        run = page.locator("#runs li").first
        expect(run).to_have_text("locked: 20 of 20 transfers, total 2990 \u2192 2990 (unchanged)")
        run_class = run.get_attribute("class")
        total_class = page.locator("#total").get_attribute("class")
    assert (run_class, total_class) == ("good", "bad")  # the run kept it; the total is still off


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
