"""Fixtures that start real redis-server processes on free loopback ports.

A test that needs Redis and cannot get one fails with the reason (it never skips).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from django_redlock.engine import Redlock
from django_redlock.engine.algorithm import procedures
from django_redlock.testing.masters import LocalMaster, local_masters

ROOT = Path(__file__).resolve().parent.parent


def fresh_python(
    code: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh Python process (``python -c``), with ``env`` added to ours: for
    what only a process's first use shows (imports, registrations, a provider set once)."""
    return subprocess.run(  # noqa: S603
        [sys.executable, "-c", code],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def printed_ok(code: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``fresh_python(code, env)``, which must exit 0 having printed only ``ok`` (its checks are
    asserts in ``code``); returned for what else it wrote (stderr)."""
    done = fresh_python(code, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok", done.stderr
    return done


def manage_py(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """``manage.py <args>`` of the testproject in a child process, with ``env`` added to ours:
    what a shell or cron sees (output, exit status)."""
    return subprocess.run(  # noqa: S603
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "testproject.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def checks_in_a_child(
    module: str,
    checks: list[Callable[[], None]],
    masters: list[LocalMaster],
    database: Mapping[str, str],
) -> list[str]:
    """``python -m <module>``, a module of checks that prints ``VENDOR <database vendor>``, one
    ``OK <name>`` per check that passed and ``DONE``, in a child on the masters and on
    ``database`` (``REDLOCK_TEST_PG``: the throwaway PostgreSQL; ``REDLOCK_TEST_DB``: a SQLite
    file). Its lines, once every check of ``checks`` said OK, in order."""
    result = subprocess.run(  # noqa: S603
        [sys.executable, "-m", module],
        cwd=ROOT,
        env={
            **os.environ,
            **database,
            "REDLOCK_NODES": ",".join(m.url for m in masters),
            # Every lock of a check is taken at its first attempt: a loaded machine must not
            # turn three masters' replies later than the default 50 ms into a failed check.
            "REDLOCK_TEST_NODE_TIMEOUT": "0.5",
            "PYTHONPATH": str(ROOT),
        },
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-6000:]
    lines = result.stdout.split("\n")
    assert [line for line in lines if line.startswith("OK ")] == [
        f"OK {check.__name__}" for check in checks
    ]
    assert "DONE" in lines
    return lines


def wait_until(condition: Callable[[], object], timeout: float, *, step: float = 0.01) -> object:
    """Poll ``condition`` until it is true or ``timeout`` seconds passed; its last value (assert
    it: ``assert wait_until(lambda: ..., 1.0), what``). Polling with a deadline, never a sleep
    sized for the machine: a loaded one only takes longer to succeed."""
    deadline = time.monotonic() + timeout
    while True:
        # The value that ended the wait, not a fresh look after it: a state that comes and goes
        # (a late SET, then its release) must not fail a wait that saw what it waited for.
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


async def await_until(
    condition: Callable[[], object], timeout: float, *, step: float = 0.01
) -> object:
    """``wait_until`` for a coroutine: poll ``condition`` without blocking the event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() >= deadline:
            return value
        await asyncio.sleep(step)


async def until_set(event: asyncio.Event, setter: asyncio.Task[Any], timeout: float = 30.0) -> None:
    """Await ``event``, which task ``setter`` sets (a holder that took its lock, say); if
    ``setter`` ended first, raise what it raised (its acquisition failed on a loaded machine)
    instead of waiting for ever: ``event.wait()`` alone has no timer, and the test would hang
    until pytest-timeout with nothing to say."""
    waiting = asyncio.ensure_future(event.wait())
    done, _ = await asyncio.wait(
        {waiting, setter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
    )
    if waiting in done:
        return
    waiting.cancel()
    if setter in done:
        setter.result()  # raises what it raised
    raise AssertionError(f"not set within {timeout} s, nor did its setter end")


def _heal(masters: list[LocalMaster]) -> None:
    """Undo any fault a test left behind and empty every master."""
    for m in masters:
        m.heal()


@pytest.fixture(scope="session")
def _shared_masters(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[int, list[LocalMaster]]]:
    started: dict[int, list[LocalMaster]] = {}
    with (
        local_masters(5, tmp_path_factory.mktemp("masters5")) as five,
        local_masters(3, tmp_path_factory.mktemp("masters3")) as three,
        local_masters(1, tmp_path_factory.mktemp("masters1")) as one,
    ):
        started.update({5: five, 3: three, 1: one})
        yield started


@pytest.fixture(scope="session")
def postgres_port() -> Iterator[int]:
    """A throwaway PostgreSQL cluster's port (tests/postgres.py: skips, or fails under CI,
    without PostgreSQL)."""
    from tests.postgres import throwaway_postgres

    with throwaway_postgres() as port:
        yield port


@pytest.fixture
def masters(_shared_masters: dict[int, list[LocalMaster]]) -> list[LocalMaster]:
    """Five empty, healthy masters (shared across tests, healed and flushed before each)."""
    _heal(_shared_masters[5])
    return _shared_masters[5]


@pytest.fixture(params=[1, 3, 5], ids=lambda n: f"N{n}")
def any_masters(
    request: pytest.FixtureRequest, _shared_masters: dict[int, list[LocalMaster]]
) -> list[LocalMaster]:
    """1, 3 and 5 empty masters in turn."""
    _heal(_shared_masters[request.param])
    return _shared_masters[request.param]


@pytest.fixture
def fresh_masters(tmp_path: Path) -> Iterator[Callable[[int], list[LocalMaster]]]:
    """Start ``n`` masters of this test's own (for faults that must not leak), stopped after."""
    with contextlib.ExitStack() as stack:
        batches = itertools.count()
        yield lambda n: stack.enter_context(local_masters(n, tmp_path / f"fresh{next(batches)}"))


@pytest.fixture
def redlock_of() -> Iterator[Callable[..., Redlock]]:
    """Build an engine over some masters (or URLs, proxies included); closed after the test."""
    made: list[Redlock] = []

    def make(masters: list[LocalMaster] | list[str], **options: object) -> Redlock:
        urls = [m if isinstance(m, str) else m.url for m in masters]  # masters, or any URLs
        engine = Redlock(urls, **options)  # type: ignore[arg-type]
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()


@pytest.fixture
def redlock_settings(settings: object, masters: list[LocalMaster]) -> list[LocalMaster]:
    """``settings.REDLOCK`` pointing at the five shared masters."""
    settings.REDLOCK = {"NODES": [m.url for m in masters]}  # type: ignore[attr-defined]
    return masters


def hand_off_time(engine: Redlock, resource: str, *, settle: float = 0.4) -> float:
    """Seconds from a holder's release to a waiting thread's acquisition: the waiter first
    fails, subscribes to release notices and sleeps (``settle``). With a large ``retry_delay``
    on ``engine``, only a notice can make this short (the waiters' safety poll is put off past
    the test, so that a loaded machine cannot make a poll pass for a notice). Fails if the
    waiter never gets the lock."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(procedures, "SAFETY_POLL", 30.0)
        return _hand_off_time(engine, resource, settle)


def _hand_off_time(engine: Redlock, resource: str, settle: float) -> float:
    holder = engine.lock(resource, ttl=5).acquire()
    got: list[float] = []

    def waiter() -> None:
        with engine.lock(resource, ttl=5, wait=10):
            got.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(settle)
    released = time.monotonic()
    holder.release()
    thread.join(10)
    assert got, "the waiter never got the lock"
    return got[0] - released
