"""Callers of one process, for the concurrency tests: outcomes as plain values, threads and
asyncio tasks that perform scripted steps on a shared ``Lock``, and what the masters store."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from django_redlock.engine import Lock
from django_redlock.testing.masters import LocalMaster

#: How long a blocked step of a caller may take before the test gives up on it.
STEP_TIMEOUT = 10.0


def outcome(call: Callable[[], object]) -> str:
    """What ``call`` came to: "ok", or the name of the exception it raised."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 (the exception's name is the observation)
        return type(exc).__name__
    return "ok"


def acquire_release(lock: Lock) -> str:
    """Acquire ``lock`` and release it at once: "ok", or the exception's name."""
    return outcome(lambda: lock.acquire().release())


async def aoutcome(awaitable: Awaitable[object]) -> str:
    try:
        await awaitable
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__
    return "ok"


def stored_values(masters: list[LocalMaster], key: str) -> list[bytes | None]:
    return [m.call("GET", key) for m in masters]  # type: ignore[misc]


def stored_owners(masters: list[LocalMaster], key: str) -> list[dict[str, Any]]:
    """The owner JSON of the value on each master: ``<32 hex token>:<json>``."""
    return [json.loads(v.split(b":", 1)[1]) for v in stored_values(masters, key) if v]


def run_thread(target: Callable[[], object], name: str | None = None) -> Any:
    """Run ``target`` in a new thread to its end; its result, or its exception re-raised."""
    done: concurrent.futures.Future[object] = concurrent.futures.Future()

    def body() -> None:
        try:
            done.set_result(target())
        except BaseException as exc:  # noqa: BLE001 (re-raised in the test's thread)
            done.set_exception(exc)

    thread = threading.Thread(target=body, name=name)
    thread.start()
    thread.join(STEP_TIMEOUT)
    return done.result(0)


# --- callers of one shared handle, scripted step by step --------------------------------------


def perform(lock: Lock, op: str) -> object:
    """One step on ``lock`` with the sync API: what a caller observes."""
    if op == "held":
        return lock.held
    if op == "validity":
        return "zero" if lock.validity == 0.0 else "positive"
    return outcome(getattr(lock, op))  # acquire, release, check


class Caller:
    """A thread (or an asyncio task, below) that performs the steps it is given, in turn."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Lock, str, concurrent.futures.Future[object]] | None]
        self.jobs = queue.SimpleQueue()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while (job := self.jobs.get()) is not None:
            lock, op, future = job
            future.set_result(perform(lock, op))

    def put(self, job: tuple[Lock, str, concurrent.futures.Future[object]] | None) -> None:
        self.jobs.put(job)

    def submit(self, lock: Lock, op: str) -> concurrent.futures.Future[object]:
        future: concurrent.futures.Future[object] = concurrent.futures.Future()
        self.put((lock, op, future))
        return future

    def ask(self, lock: Lock, op: str) -> object:
        return self.submit(lock, op).result(STEP_TIMEOUT)

    def stop(self) -> None:
        self.put(None)
        self.thread.join(STEP_TIMEOUT)


class TaskCaller(Caller):
    """The same, as a task on an event loop that runs in a thread of its own; acquire and
    release with the async API."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.tasks: asyncio.Queue[tuple[Lock, str, concurrent.futures.Future[object]] | None]
        self.tasks = asyncio.Queue()
        self.served = asyncio.run_coroutine_threadsafe(self.aserve(), loop)

    async def aserve(self) -> None:
        while (job := await self.tasks.get()) is not None:
            lock, op, future = job
            if op in ("acquire", "release"):
                future.set_result(await aoutcome(getattr(lock, f"a{op}")()))
            else:
                future.set_result(perform(lock, op))

    def put(self, job: tuple[Lock, str, concurrent.futures.Future[object]] | None) -> None:
        self.loop.call_soon_threadsafe(self.tasks.put_nowait, job)

    def stop(self) -> None:
        self.put(None)
        self.served.result(STEP_TIMEOUT)
