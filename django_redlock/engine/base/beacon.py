"""A one-shot event that threads and asyncio tasks alike can wait on: a waiter's notice, its
inbox confirmed, its local turn (``notices``, ``local_queues``)."""

from __future__ import annotations

import asyncio
import threading


class Beacon:
    """A one-shot event that both threads and asyncio tasks can wait on. ``fired`` says whether
    it fired; a thread waiting in ``ReleaseNotices.wait`` can also be woken without it
    (``nudge``: the reading turn is free)."""

    __slots__ = ("_event", "_futures", "_guard", "fired")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._guard = threading.Lock()
        self.fired = False

    def fire(self) -> None:
        if self.fired:
            # Fired already and not cleared since: no future waits (one is added only while
            # unfired), and its thread does not sleep on the event (set, or not if it was fired
            # awake: ``fire_awake``) before it looks at ``fired``. A clear racing this look is
            # the clear that would have come after the fire. (A release's every master's word
            # fires its waiter's beacon: ~100 bytecodes of ``Event.set`` saved on that path.)
            return
        with self._guard:
            self.fired = True
            self._event.set()
            futures, self._futures = self._futures, []
        for loop, future in futures:
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop closed meanwhile: no one awaits there any more
                pass

    def fire_awake(self) -> None:
        """``fire``, by the one thread that waits on it, while it is awake (reading the masters'
        words for itself): no one sleeps on its event or awaits it, and its thread looks at
        ``fired`` before it sleeps again, so setting that is all (an ``Event.set`` and the
        clearing after it: ~115 bytecodes on a hand-off's path, measured)."""
        self.fired = True

    def nudge(self) -> None:
        self._event.set()

    def clear(self) -> None:
        with self._guard:
            self.fired = False
            if self._event.is_set():  # (mostly not: fired awake, see ``fire_awake``)
                self._event.clear()

    def wait(self, timeout: float) -> bool:
        """Sleep until it fires (or a nudge, or ``timeout``); answers whether it fired."""
        self._event.wait(max(timeout, 0.0))
        with self._guard:
            if not self.fired:
                self._event.clear()  # a nudge: spent
            return self.fired

    async def await_(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._guard:
            if self.fired:
                return True
            self._futures.append((loop, future))
        timer = loop.call_later(max(timeout, 0.0), _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            with self._guard:
                if (loop, future) in self._futures:
                    self._futures.remove((loop, future))
        return self.fired


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
