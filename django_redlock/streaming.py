"""A lock held until a streaming response's body is sent (``lock_view`` hands its lock over here
when a view returns a ``StreamingHttpResponse`` or ``FileResponse``): released when the stream is
exhausted, fails, or is closed early by the server, exactly once."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Iterable, Iterator
from types import TracebackType
from typing import Any

from django.http.response import StreamingHttpResponse

from .engine import Lock, LockLost

logger = logging.getLogger("django_redlock")


def hand_over_to_stream(response: StreamingHttpResponse, lock: Lock) -> None:
    """Wrap the response's content so that the lock is released when the body is done."""
    content = response.streaming_content
    if response.is_async:
        response.streaming_content = _AsyncLockedStream(lock, content)
    else:
        response.streaming_content = _LockedStream(lock, content)  # type: ignore[arg-type]


class _StreamRelease:
    """Release the lock exactly once: when the stream ends (raising ``LockLost`` if the lease ran
    out), fails, or is closed early by the server (``close()``, registered by Django as one of the
    response's closers).

    Only the thread or task that acquired a lock may release it. When the end comes from
    elsewhere (an ASGI server closing the response from a worker thread, an abandoned async
    stream finalized in another task), the lock cannot be released here: we drop our reference
    instead, which stops its renewal, and it expires within its TTL.
    """

    def __init__(self, lock: Lock) -> None:
        self._lock: Lock | None = lock
        self._mutex = threading.Lock()

    def _take(self) -> Lock | None:
        with self._mutex:
            lock, self._lock = self._lock, None
            return lock

    def _exit(self, exc: BaseException | None) -> None:
        lock = self._take()
        if lock is not None:
            try:
                lock.__exit__(*_exc_info(exc))
            except RuntimeError as error:  # not the owner: see the class docstring
                _abandon(lock, error)

    async def _aexit(self, exc: BaseException | None) -> None:
        lock = self._take()
        if lock is not None:
            try:
                await lock.__aexit__(*_exc_info(exc))
            except RuntimeError as error:
                _abandon(lock, error)

    def close(self) -> None:
        # Closed before the end: nobody is left to read LockLost (lock_lost and the log said it).
        with contextlib.suppress(LockLost):
            self._exit(None)


def _abandon(lock: Lock, error: RuntimeError) -> None:
    # Log text, not the error: a kept log record must not keep the lock (via the traceback's
    # frames) alive, or the watchdog would renew it for as long as the record lives.
    logger.warning(
        "lock_view: the stream of %r ended outside the thread or task that holds its lock (%s); "
        "it is no longer renewed and expires within its TTL (%ss)",
        lock.resource,
        str(error),
        lock.ttl,
    )


class _LockedStream(_StreamRelease):
    def __init__(self, lock: Lock, content: Iterable[bytes]) -> None:
        super().__init__(lock)
        self._content = content

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._content
        except BaseException as exc:  # GeneratorExit included: the server stopped reading
            self._exit(exc)
            raise
        self._exit(None)


class _AsyncLockedStream(_StreamRelease):
    def __init__(self, lock: Lock, content: Any) -> None:
        super().__init__(lock)
        self._content = content

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._content:
                yield chunk
        except BaseException as exc:
            await self._aexit(exc)
            raise
        await self._aexit(None)


def _exc_info(
    exc: BaseException | None,
) -> tuple[type[BaseException] | None, BaseException | None, TracebackType | None]:
    if exc is None:
        return None, None, None
    return type(exc), exc, exc.__traceback__
