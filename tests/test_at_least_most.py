"""``at_least`` and ``at_most`` on the engine's locks, on real masters.

``at_least``: a body that ends sooner leaves the lock held, unrenewed, until ``at_least`` after
it was taken (the key lapses on the masters by itself), marked finished for the operator pages.
``at_most``: the lease never reaches past it; the holder is told it lost the lock.
"""

from __future__ import annotations

import time

import pytest

from django_redlock.engine import LockContended, LockLost
from django_redlock.engine.base.values import parse_value
from tests.conftest import wait_until


def pttls(masters, engine, resource):
    key = engine.lock_key(resource)
    return [m.call("PTTL", key) for m in masters]


def test_a_lock_finished_before_at_least_stays_held_until_then(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    before = time.time()
    with engine.lock("job", ttl=10, at_least=1.5):
        taken = time.monotonic()
    # Ended at once, yet held: a copy of the job elsewhere skips.
    with pytest.raises(LockContended):
        engine.lock("job", ttl=10).acquire()
    ttls = pttls(masters, engine, "job")
    assert all(0 < t <= 1600 for t in ttls), ttls  # cut from the TTL (10 s) to at_least's end
    holder = engine.holder("job")
    assert holder is not None
    assert holder.owner.until is not None
    # At least 1.5 s after it was taken: between 1.5 s after this test began to take it and
    # 1.5 s after now (bounds a loaded machine cannot push it out of).
    assert before + 1.5 - 0.01 <= holder.owner.until <= time.time() + 1.5 + 0.01
    assert "finished, held until" in str(holder.owner)
    # Free again once at_least has passed, with no one releasing it.
    time.sleep(max(0.0, taken + 1.5 + 0.2 - time.monotonic()))
    with engine.lock("job", ttl=10):
        pass


def test_at_least_longer_than_the_ttl_is_kept_past_the_ttl(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    with engine.lock("job", ttl=1.0, at_least=2.5):
        pass
    time.sleep(1.2)  # past the TTL: still held, for at_least (1.3 s more)
    with pytest.raises(LockContended):
        engine.lock("job", ttl=1).acquire()


def test_a_body_longer_than_at_least_releases_at_once(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    with engine.lock("job", ttl=5, at_least=0.3):
        time.sleep(0.5)
    assert pttls(masters, engine, "job") == [-2] * len(masters)  # deleted, not kept


def test_finishing_a_lock_taken_by_someone_else_meanwhile_leaves_theirs(
    masters, redlock_of
) -> None:
    """The finish is a compare-and-set: a lock that ran out and was taken by another owner is
    not rewritten (and the holder is told it lost its lock)."""
    engine = redlock_of(masters)
    lock = engine.lock("job", ttl=1.0, at_least=5)
    lock.acquire()
    assert wait_until(lambda: pttls(masters, engine, "job") == [-2] * len(masters), 10)  # ran out
    other = engine.lock("job", ttl=5)
    with other:
        with pytest.raises(LockLost):
            lock.release()
        values = [m.call("GET", engine.lock_key("job")) for m in masters]
        assert all(parse_value(v)[1].until is None for v in values)  # theirs, untouched


def test_at_most_stops_renewal_there_and_tells_the_holder(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    told: list[float] = []
    taken = time.monotonic()
    # A 1 s TTL renewed every 1/3 s: a renewal may come 2/3 s late on a loaded machine.
    lock = engine.lock(
        "job",
        ttl=1.0,
        auto_extend=True,
        at_most=2.0,
        on_lost=lambda lock, error: told.append(time.monotonic() - taken),
    )
    lock.acquire()
    lease = engine.holders[lock.key]
    assert wait_until(lambda: time.monotonic() - taken > 1.2 and lease.extensions >= 3, 10)
    assert lock.held  # renewed past its TTL, as usual, before at_most
    assert wait_until(lambda: told, 10), "the holder was not told"
    # A hung job: past at_most the lock is free for others (its keys lapse at the cap; the
    # holder is told a drift allowance before).
    assert wait_until(lambda: pttls(masters, engine, "job") == [-2] * len(masters), 5)
    with engine.lock("job", ttl=1):
        pass
    with pytest.raises(LockLost):
        lock.release()
    # At at_most (less the drift allowance), not a TTL later (3 s).
    assert 1.8 <= told[0] <= 2.5, told


def test_at_most_below_the_ttl_cuts_the_first_lease(masters, redlock_of) -> None:
    engine = redlock_of(masters)
    lock = engine.lock("job", ttl=30, at_most=2)
    assert lock.ttl == 2
    with lock:
        assert all(0 < t <= 2000 for t in pttls(masters, engine, "job"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"at_least": 5, "at_most": 2}, "at_least (5) must not exceed at_most (2)"),
        ({"at_least": -1}, "at_least must be > 0 seconds, got -1"),
        ({"at_most": -0.5}, "at_most must be > 0 seconds, got -0.5"),
        ({"at_least": 400 * 24 * 3600}, "at_least must be at most 31536000 seconds"),
        ({"at_most": float("nan")}, "at_most must be finite, got nan"),
        ({"at_least": "5"}, "at_least must be a number of seconds, got '5'"),
        # It caps the lease: shorter than the shortest lease, it named the TTL, not itself.
        ({"at_most": 0.001}, "at_most must be at least 0.01 seconds (a lease), got 0.001"),
    ],
)
def test_bad_bounds_fail_before_any_network_call(options, message) -> None:
    from django_redlock import locked
    from django_redlock.engine import Redlock

    # A master that does not exist: any network call would fail differently.
    engine = Redlock(["redis://127.0.0.1:1"])
    try:
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
            engine.lock("job", **options)
        with pytest.raises(ValueError, match="at_"):
            locked("job", **options)  # at decoration, not at the first call
    finally:
        engine.close()


# --- the guards, on processes whose clocks differ -------------------------------------------


@pytest.fixture
def cron(tmp_path, redlock_settings):
    """Start ``manage.py <args>`` as cron would on a host whose wall clock is ``offset``
    seconds off (the clock shim, LD_PRELOAD), firing when that clock reads ``fire_at``."""
    import os
    import subprocess
    import sys

    from django_redlock.testing.clock import clock_shim
    from tests.conftest import ROOT

    shim = clock_shim(tmp_path / "shim")
    database = tmp_path / "db.sqlite3"
    started: list[subprocess.Popen[str]] = []

    def start(fire_at: float, offset: float, *args: str) -> subprocess.Popen[str]:
        offset_file = tmp_path / f"offset-{len(started)}"
        offset_file.write_text(str(round(offset * 1000)))
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings_subprocess",
            "REDLOCK_TEST_NODES": ",".join(m.url for m in redlock_settings),
            "REDLOCK_TEST_DB": str(database),
            "PYTHONPATH": str(ROOT),
            "LD_PRELOAD": str(shim),
            "CLOCKSHIFT_FILE": str(offset_file),
        }
        command = [sys.executable, "-m", "tests.cron_fire", str(fire_at), sys.executable]
        proc = subprocess.Popen(  # noqa: S603
            [*command, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_a_cron_copy_on_a_host_whose_clock_is_late_skips_with_at_least(cron) -> None:
    """Two hosts fire the same quick job "at 00:00" by their clocks; one clock is 2.5 s late.
    Without ``--at-least`` the job runs twice in that slot; with ``--at-least 6``, once: the late
    copy finds the finished run's lock still held and skips (exit 75)."""
    from django_redlock.commands import EXIT_HELD

    fire_at = time.time() + 1.0
    runs = {}
    for key, bounds in (("plain", ()), ("atleast", ("--at-least", "6"))):
        runs[key] = [
            cron(fire_at, offset, "redlock_run", "--key", f"slot:{key}", *bounds, "--", "check")
            for offset in (0.0, -2.5)
        ]
    outcomes = {key: [(p.wait(60), p.communicate()) for p in procs] for key, procs in runs.items()}
    (first, (out, err)), (late, (late_out, late_err)) = outcomes["plain"]
    assert (first, late) == (0, 0), (err, late_err)  # both ran: twice in one slot
    assert "no issues" in out
    assert "no issues" in late_out
    # Once: one copy ran, the other skipped (exit 75) and says why. Which one is the order in
    # which they got past Django's start-up after firing: the late host's, 2.5 s later, unless
    # a busy machine slowed the first one's start-up more than that.
    ((ran, (out, err)), (skipped, (skipped_out, skipped_err))) = sorted(
        outcomes["atleast"], key=lambda outcome: outcome[0]
    )
    assert (ran, skipped) == (0, EXIT_HELD), (err, skipped_err)
    assert "no issues" in out
    assert "finished, held until" in skipped_err
    assert "no issues" not in skipped_out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--at-least", "5", "--at-most", "2", "--", "check"], r"--at-least \(5\) must not exceed"),
        (["--at-least", "-1", "--", "check"], "--at-least must be > 0 seconds"),
        (["--at-most", "1e9", "--", "check"], "--at-most must be at most"),
        (["--at-most", "0.001", "--", "check"], "--at-most must be at least 0.01 seconds"),
        (["--at-least", "--", "check"], "--at-least: expected one argument"),
    ],
)
def test_redlock_run_bad_bounds(redlock_settings, args, message) -> None:
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=message):
        call_command("redlock_run", *args)


def test_redlock_run_at_least_without_a_number_is_an_argparse_error_exit_2() -> None:
    from tests.conftest import manage_py

    result = manage_py("redlock_run", "--at-least", "--", "check", env={})
    assert result.returncode == 2, result.stderr
    assert "--at-least" in result.stderr


def test_the_guards_take_at_least_and_at_most(redlock_settings) -> None:
    from django.core.management.base import BaseCommand

    from django_redlock import guard_command, redlock
    from django_redlock.commands import GuardedCommandMixin

    with guard_command("job", at_least=2):
        pass
    with pytest.raises(LockContended):
        redlock("command:job").acquire()

    class Command(GuardedCommandMixin, BaseCommand):
        lock_key = "mixin-job"
        lock_at_least = 2.0
        lock_at_most = 30.0

        def handle(self, *args, **options):
            return None

    Command().execute(stdout=None, stderr=None, no_color=False, force_color=False, skip_checks=True)
    with pytest.raises(LockContended):
        redlock("mixin-job").acquire()


def test_redlock_status_shows_a_finished_lock(redlock_settings) -> None:
    import io

    from django.core.management import call_command

    from django_redlock import redlock

    with redlock("job", at_least=5, label="nightly"):
        pass
    out = io.StringIO()
    call_command("redlock_status", stdout=out)
    assert "finished, held until" in out.getvalue()


# --- metrics per job ---------------------------------------------------------------------------


def test_guarded_commands_count_runs_skips_and_losses_per_job(redlock_settings) -> None:
    from django.core.management import CommandError, call_command

    from tests.test_signals_metrics import sample

    def count(outcome: str) -> float:
        return sample("redlock_job_runs_total", job="check", outcome=outcome)

    before = {o: count(o) for o in ("ran", "skipped", "lost")}
    seconds = sample("redlock_job_seconds_count", job="check")
    call_command("redlock_run", "--", "check")
    from tests.test_commands import HeldElsewhere

    with HeldElsewhere("command:check"), pytest.raises(CommandError):
        call_command("redlock_run", "--", "check")
    assert count("ran") - before["ran"] == 1
    assert count("skipped") - before["skipped"] == 1
    assert count("lost") == before["lost"]
    assert sample("redlock_job_seconds_count", job="check") - seconds == 1
    # Labelled by the job's name, never by a formatted key.
    from django_redlock.contrib import prometheus

    with pytest.raises(ValueError, match="outcome"):
        prometheus.job("check", "report:42")


def test_the_demo_scene_runs_the_job_thrice_per_slot_without_at_least_once_with(
    redlock_settings,
) -> None:
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("skewed_cron", "--slots", "1", "--period", "3", stdout=out)
    assert out.getvalue().splitlines() == [
        "without at_least:",
        "  slot 1: ran 3 times (hosts A, B, C)",
        "with at_least=2.5s:",
        "  slot 1: ran once (hosts A)",
    ]


def test_finish_asked_again_after_a_broken_connection_confirms(masters) -> None:
    """A FINISH whose reply was lost with its connection is sent again (the round's rule): the
    master that applied the first finds our finished value, and confirms instead of calling
    the lock gone."""
    from django_redlock.engine.base.values import finished_value, make_value
    from django_redlock.engine.scripts import plain as scripts

    value = make_value("job", 10.0, None)
    finished = finished_value(value, time.time() + 5)
    master = masters[0]
    master.call("SET", "redlock:lock:job", value, "PX", 10_000)
    finish = ("EVAL", scripts.FINISH.source, 2, "redlock:lock:job", "redlock:queue:job")
    args = (value, 5000, finished, "")
    assert master.call(*finish, *args) == 1
    assert master.call(*finish, *args) == 1  # asked again: still ours, finished
    assert master.call("GET", "redlock:lock:job") == finished.encode()
    master.call("SET", "redlock:lock:job", make_value("other", 10.0, None), "PX", 10_000)
    assert master.call(*finish, *args) == 0  # another owner's: never touched


def test_the_admin_page_shows_a_finished_lock(client, redlock_settings, django_user_model) -> None:
    from django.contrib.auth.models import Permission

    from django_redlock import redlock

    user = django_user_model.objects.create_user("viewer", password="x", is_staff=True)  # noqa: S106
    user.user_permissions.add(Permission.objects.get(codename="view_held_locks"))
    client.force_login(user)
    with redlock("nightly", at_least=5, label="cron"):
        pass
    html = client.get("/admin/django_redlock/heldlock/").content.decode()
    assert "nightly" in html
    assert "(finished, held until " in html


def test_bounds_are_for_an_exclusive_lock_only(redlock_settings) -> None:
    from django.core.management import CommandError, call_command

    from django_redlock import redlock

    with pytest.raises(ValueError, match="do not apply to limit= or shared=True"):
        redlock("job", limit=3, at_least=5)
    with pytest.raises(ValueError, match="do not apply to limit= or shared=True"):
        redlock("job", shared=True, at_most=5)
    with pytest.raises(CommandError, match="--limit takes no --at-least"):
        call_command("redlock_run", "--limit", "2", "--at-least", "5", "--", "check")


def test_redlock_run_at_most_too_short_is_a_usage_error_not_a_traceback() -> None:
    from tests.conftest import manage_py

    result = manage_py("redlock_run", "--at-most", "0.001", "--", "check", env={})
    assert result.returncode == 2, result.stderr
    assert "--at-most must be at least 0.01 seconds" in result.stderr
    assert "Traceback" not in result.stderr


def test_extend_never_reaches_past_at_most(masters, redlock_of) -> None:
    """The holder's own ``extend()`` keeps ``at_most`` as the watchdog does: a renewal is cut
    to end at the cap (``extend(ttl=30)`` too), the key lapses on every master there, and an
    extend at the cap says the lease is lost. (It renewed for the full TTL each time: the key
    was still on 3/3 masters past the cap, and ``extend(ttl=30)`` gave a 30 s lease.)"""
    engine = redlock_of(masters)
    lock = engine.lock("capped", ttl=2, at_most=3)
    lock.acquire()
    cap = time.monotonic() + 3  # (at most: the lease was taken a little before)
    assert lock.extend(ttl=30) <= 3
    assert all(0 < t <= 3000 for t in pttls(masters, engine, "capped"))
    time.sleep(1.2)  # (0.8 s of the 2 s lease left: room for a loaded machine's extend)
    validity = lock.extend()  # within the cap: cut to end there, not 2 s later
    assert validity <= cap - time.monotonic()
    left_ms = (cap - time.monotonic()) * 1000  # (the keys expire by the cap: read after this)
    assert all(t <= left_ms + 2 for t in pttls(masters, engine, "capped"))
    time.sleep(max(0.0, cap - time.monotonic()))
    with pytest.raises(LockLost):
        lock.extend(ttl=30)  # the lease ended at the cap, as at_most says
    assert pttls(masters, engine, "capped") == [-2] * len(masters)  # lapsed: free for others
    with pytest.raises(LockLost):
        lock.release()


def test_extend_at_the_cap_is_refused_naming_it(masters, redlock_of) -> None:
    """A lease still valid whose cap is reached (``max_hold`` shorter than what is left of
    the lease cannot happen through ``at_most``, whose first lease ends by the cap: here the
    cap is moved as a re-entry with a tighter ``at_most`` moves it) is not renewed:
    ``ExtensionLimit`` names the cap, and nothing is sent."""
    from django_redlock.engine import ExtensionLimit

    engine = redlock_of(masters)
    with engine.lock("capped", ttl=5) as lock:
        lease = engine.holders[lock.key]
        lease.max_hold = time.monotonic() - lease.acquired_at  # reached now
        with pytest.raises(ExtensionLimit, match=r"reached its cap \(at_most/max_hold="):
            lock.extend()
        assert lease.extensions == 0
        assert all(t > 3000 for t in pttls(masters, engine, "capped"))  # not renewed, not cut


# --- re-entry: an inner entry's bounds are kept too -------------------------------------------


def _taken_elsewhere(engine, resource: str) -> bool:
    """Whether another thread can take ``resource`` now (then it lets it go at once)."""
    got: list[bool] = []

    def take() -> None:
        try:
            with engine.lock(resource, ttl=1):
                got.append(True)
        except LockContended:
            got.append(False)

    import threading

    thread = threading.Thread(target=take)
    thread.start()
    thread.join(10)
    return got == [True]


def test_an_inner_entrys_longer_at_least_keeps_the_lock(masters, redlock_of) -> None:
    """The outer entry has no ``at_least``, the inner one (re-entering) has 2 s: leaving both
    keeps the lock until 2 s after the inner entry, finished, as ``at_least`` says."""
    engine = redlock_of(masters)
    outer = engine.lock("slot", ttl=5, reentrant=True)
    inner = engine.lock("slot", ttl=5, reentrant=True, at_least=2)
    with outer:
        with inner:
            assert outer.hold_count == 2
    left = pttls(masters, engine, "slot")
    assert all(0 < t <= 2100 for t in left), left  # kept, finished, until the inner's bound
    assert not _taken_elsewhere(engine, "slot")


def test_an_inner_entrys_shorter_at_most_cuts_the_lease(masters, redlock_of) -> None:
    """The outer entry is renewed with no cap; an inner one re-enters with ``at_most=1``: the
    lease is cut at once to end by then, renewals stop there, and the holder is told it lost
    the lock; another process can take it then."""
    engine = redlock_of(masters)
    told: list[float] = []
    outer = engine.lock(
        "slot", ttl=10, auto_extend=True, reentrant=True, on_lost=lambda *_: told.append(1.0)
    )
    inner = engine.lock("slot", ttl=10, reentrant=True, at_most=1)
    outer.acquire()
    inner.acquire()
    assert all(0 < t <= 1000 for t in pttls(masters, engine, "slot"))  # cut now, not in 10 s
    deadline = time.monotonic() + 5
    while not outer.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert outer.lost
    # (Lost here a drift allowance before its keys expire on the masters.)
    assert wait_until(lambda: _taken_elsewhere(engine, "slot"), 5)
    inner.release()  # (an inner entry: no round)
    with pytest.raises(LockLost):
        outer.release()


def test_inner_bounds_that_contradict_the_lease_are_refused(masters, redlock_of) -> None:
    """Kept at least 5 s (the outer entry) but held at most 1 s (the inner one): a
    contradiction, refused before anything changes; the outer entry is untouched."""
    engine = redlock_of(masters)
    with engine.lock("slot", ttl=5, reentrant=True, at_least=5) as outer:
        with pytest.raises(ValueError, match=r"at_most=1\b.*kept at least"):
            engine.lock("slot", ttl=5, reentrant=True, at_most=1).acquire()
        assert outer.hold_count == 1
        assert all(t > 4000 for t in pttls(masters, engine, "slot"))


def test_an_async_inner_entrys_shorter_at_most_cuts_the_lease_too(masters, redlock_of) -> None:
    """The same re-entry from a task (``async with``): the lease is cut to the inner
    ``at_most`` when the inner entry is made (its round runs synchronously, as re-entry does)."""
    import asyncio

    engine = redlock_of(masters)

    async def main() -> list[int]:
        outer = engine.lock("aslot", ttl=10, auto_extend=True, reentrant=True)
        inner = engine.lock("aslot", ttl=10, reentrant=True, at_most=1)
        async with outer, inner:
            return pttls(masters, engine, "aslot")

    left = asyncio.run(asyncio.wait_for(main(), 20))
    assert all(0 < t <= 1000 for t in left), left
