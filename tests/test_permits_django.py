"""``limit=N`` on the Django surfaces: ``redlock()``, ``locked``, ``lock_view`` (429 with
``Retry-After`` when every permit is taken), the command guard and ``redlock_run --limit``; on
real masters, with the permits held for real."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

import pytest
from django.core.management import CommandError, call_command
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path

from django_redlock import LockContended, locked, redlock
from django_redlock.commands import EXIT_HELD, guard_command
from django_redlock.decorators import lock_view

pytestmark = pytest.mark.urls("tests.test_permits_django")


@lock_view("partner-api", limit=2)
def partner(request: HttpRequest) -> HttpResponse:
    return HttpResponse("called")


@lock_view("partner-api", limit=2, status=503)
def partner_503(request: HttpRequest) -> HttpResponse:
    return HttpResponse("called")


urlpatterns = [path("partner/", partner), path("partner-503/", partner_503)]


@contextlib.contextmanager
def permits_held(resource: str, limit: int, count: int) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            stack.enter_context(redlock(resource, limit=limit, ttl=10))
        yield


def test_lock_view_lets_limit_requests_in_and_answers_429_after(redlock_settings: list) -> None:
    client = Client()
    with permits_held("partner-api", 2, 1):
        assert client.get("/partner/").content == b"called"  # one permit left
    with permits_held("partner-api", 2, 2):
        refused = client.get("/partner/")
        assert refused.status_code == 429
        assert refused["Retry-After"] == "1"
        assert client.get("/partner-503/").status_code == 503  # status= still wins
    assert client.get("/partner/").status_code == 200


def test_bad_limit_fails_when_decorating() -> None:
    with pytest.raises(ValueError, match="limit must be an int from 1 to 10000, got 0"):
        lock_view("x", limit=0)
    with pytest.raises(ValueError, match="limit=2 with shared=True"):
        lock_view("x", limit=2, shared=True)


def test_redlock_and_locked_take_permits(redlock_settings: list) -> None:
    calls: list[int | None] = []

    @locked("job:{kind}", limit=2)
    def job(kind: str) -> None:
        calls.append(kind and 1)

    with redlock("job:export", limit=2) as first:
        assert first.held
        job("export")  # the second permit
        with redlock("job:export", limit=2), pytest.raises(LockContended, match="all 2 permits"):
            job("export")
    assert calls == [1]


def test_the_command_guard_lets_limit_runs_in(redlock_settings: list) -> None:
    with guard_command("import", limit=2) as one, guard_command("import", limit=2) as two:
        assert one.held
        assert two.held
        with pytest.raises(CommandError) as raised, guard_command("import", limit=2):
            pytest.fail("a third run went in")
    assert raised.value.returncode == EXIT_HELD
    assert "all 2 permits are held" in str(raised.value)


def test_redlock_run_limit(redlock_settings: list) -> None:
    out = io.StringIO()
    with permits_held("command:check", 2, 1):
        call_command("redlock_run", "--limit", "2", "--", "check", stdout=out)
    assert "no issues" in out.getvalue()
    with permits_held("command:check", 2, 2), pytest.raises(CommandError) as raised:
        call_command("redlock_run", "--limit", "2", "--", "check")
    assert raised.value.returncode == EXIT_HELD
    # A plain run of the same command while permits are held: refused, naming the mismatch.
    with permits_held("command:check", 2, 1), pytest.raises(CommandError, match="semaphore"):
        call_command("redlock_run", "--", "check")


@pytest.mark.parametrize("bad", ["0", "10001", "two"])
def test_redlock_run_bad_limit(redlock_settings: list, bad: str) -> None:
    with pytest.raises(CommandError, match="--limit"):
        call_command("redlock_run", "--limit", bad, "--", "check")
