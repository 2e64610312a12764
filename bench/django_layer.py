"""Our lock as a Django project uses it (issue 20): ``with redlock(r):`` / ``async with
redlock(r):`` through ``settings.REDLOCK``, with what a project has switched on: the Django
observer (log records, signals, Prometheus metrics when ``prometheus_client`` is installed, span
attributes when OpenTelemetry is), one receiver on ``lock_acquired`` and one on ``lock_released``
(a project that listens), and the DB guard (``db_guard=True``, the default).

Settings are configured once per process (``settings.configure``); each contender points
``REDLOCK`` at its scenario's masters with ``override_settings`` while it lives, so the engine
(``get_redlock()``) is the settings' one, built on first use as in a project.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .peers import Batch, timed

TTL = 10.0
NODE_TIMEOUT = 0.05


def _configure() -> None:
    import django
    from django.conf import settings

    if not settings.configured:
        settings.configure(
            INSTALLED_APPS=["django_redlock"],
            DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
            REDLOCK={"NODES": []},
            LOGGING_CONFIG=None,
        )
        django.setup()
        from django_redlock.signals import lock_acquired, lock_released

        lock_acquired.connect(_listened, dispatch_uid="bench-acquired")
        lock_released.connect(_listened, dispatch_uid="bench-released")


#: What the receivers heard (they must cost what a project's receiver costs: a call).
heard = [0]


def _listened(**kwargs: Any) -> None:
    heard[0] += 1


class _Settings:
    """``REDLOCK`` pointed at the scenario's masters while any contender of this module lives
    (both rows of a scenario share one engine, as the threads and tasks of a project do)."""

    def __init__(self) -> None:
        self.users = 0
        self.scope: Any = None

    def enter(self, urls: Sequence[str]) -> None:
        _configure()
        from django.test import override_settings

        if self.users == 0:
            self.scope = override_settings(
                REDLOCK={"NODES": list(urls), "NODE_TIMEOUT": NODE_TIMEOUT}
            )
            self.scope.enable()
        self.users += 1

    def leave(self) -> None:
        self.users -= 1
        if self.users == 0:
            self.scope.disable()


_shared = _Settings()


class OursDjango:
    name = "ours (redlock(), Django)"
    meaning = (
        "`with redlock(r, ttl=10):` through settings.REDLOCK: a new lock object per cycle, the "
        "Django observer (signals with a receiver, metrics, log records), the DB guard"
    )

    def __init__(self, urls: Sequence[str], resource: str) -> None:
        _shared.enter(urls)
        from django_redlock import redlock

        self._redlock = redlock
        self._resource = resource

    def _cycle(self) -> None:
        with self._redlock(self._resource, ttl=TTL):
            pass

    def run(self, cycles: int) -> Batch:
        return timed(self._cycle, cycles)

    def close(self) -> None:
        _shared.leave()


class OursDjangoAsync:
    name = "ours (redlock(), Django, async)"
    meaning = "the same, `async with redlock(r, ttl=10):`, all cycles in one long-lived loop"

    def __init__(self, urls: Sequence[str], resource: str) -> None:
        _shared.enter(urls)
        from django_redlock import redlock

        self._redlock = redlock
        self._resource = resource
        self._runner = asyncio.Runner()

    async def _batch(self, cycles: int) -> Batch:
        import time

        batch = Batch()
        clock = time.perf_counter_ns
        redlock, resource = self._redlock, self._resource
        for _ in range(cycles):
            start = clock()
            try:
                async with redlock(resource, ttl=TTL):
                    pass
            except Exception as exc:  # noqa: BLE001 (a failed cycle is a result to report)
                batch.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            batch.times_ns.append(clock() - start)
        return batch

    def run(self, cycles: int) -> Batch:
        return self._runner.run(self._batch(cycles))

    def close(self) -> None:
        self._runner.close()
        _shared.leave()
