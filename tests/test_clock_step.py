"""The wall-clock hazard, on real masters: Redis keeps each expiry as an absolute time on the
master's own wall clock, so stepping the clock of a majority forward ends a held lease early and
lets a second owner in. docs/guarantees.md says so; ``redlock_status`` and the admin warn about it.

The clocks are stepped by ``django_redlock.testing.clock`` (an LD_PRELOAD shim built with the C
compiler; without one these tests fail with the reason, they do not skip).
"""

from __future__ import annotations

import contextlib
import re
from io import StringIO

import pytest
from django.core.management import call_command

from django_redlock import LockContended, LockLost, conf
from django_redlock.testing.clock import clock_shim, shifted_clock_env, step_clock
from django_redlock.testing.masters import local_masters


@pytest.fixture
def shifted_masters(tmp_path, settings):
    """Three masters whose wall clocks ``step_clock`` can move; REDLOCK points at them."""
    env = shifted_clock_env(clock_shim(tmp_path / "shim"))
    with local_masters(3, tmp_path / "masters", env=env) as masters:
        settings.REDLOCK = {"NODES": [m.url for m in masters]}
        yield masters


def test_a_clock_stepped_forward_on_a_majority_lets_a_second_owner_in(shifted_masters, redlock_of):
    first = conf.get_redlock().lock("invoice:42", ttl=30).acquire()
    other_process = redlock_of(shifted_masters)  # another engine: as another process would be
    with pytest.raises(LockContended):
        other_process.lock("invoice:42", ttl=30).acquire()
    for master in shifted_masters[:2]:
        step_clock(master, 60)  # 2 of 3: a majority, 60 s past the 30 s lease
    second = other_process.lock("invoice:42", ttl=30).acquire()  # the hazard: two owners
    assert second.held
    assert first.validity > 25  # the first holder's monotonic clock still says it holds it
    second.release()
    with contextlib.suppress(LockLost):
        first.release()


def test_status_and_admin_warn_about_a_stepped_clock(shifted_masters, admin_client):
    step_clock(shifted_masters[0], 60)
    out = StringIO()
    call_command("redlock_status", "--wide", stdout=out)
    text = out.getvalue()
    sixty = r"(59\.9\d\d|60\.0\d\d)"  # 60 s, measured over a round trip
    assert re.search(rf"\+{sixty} s", text)  # the master's clock against ours, in its row
    assert re.search(rf"{re.escape(shifted_masters[0].url)}: clock is \+{sixty} s off", text)
    assert re.search(rf"master clocks differ by {sixty} s", text)  # and against the others
    assert "slew, never step" in text
    html = admin_client.get("/admin/django_redlock/heldlock/").content.decode()
    assert 'id="redlock-clock-warning"' in html
    assert re.search(rf"master clocks differ by {sixty} s", html)
