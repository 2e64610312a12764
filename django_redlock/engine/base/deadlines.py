"""One asyncio timer per event loop for every deadline of our rounds and admission waits.

A burst of a thousand tasks has a thousand rounds waiting for replies and hundreds of
acquisitions waiting for their turn, each with a deadline. As one ``loop.call_at`` each, every
deadline cost a ``TimerHandle`` pushed on the loop's heap (ordered by a Python ``__lt__``, ten or
so calls a push with a thousand timers there) and a cancellation that the loop sweeps later;
most of them are cancelled (the replies came first). Here a deadline is a tuple on a heap of our
own (ordered in C), and the loop holds one timer, for the earliest: what came in time costs one
push and nothing else.

A deadline fires by calling ``expire(future)``, unless ``future`` is done by then (it was
answered). Times are ``time.monotonic()`` seconds, like every deadline of the engine.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

from .loops import of_loop

Expire = Callable[[asyncio.Future[Any]], None]


class Deadlines:
    """The deadlines of one event loop (``of(loop)``)."""

    __slots__ = ("_armed", "_heap", "_loop", "_order", "_pushed", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._heap: list[tuple[float, int, Expire, asyncio.Future[Any]]] = []
        self._order = itertools.count()  # ties go in arrival order, never compare futures
        self._timer: asyncio.TimerHandle | None = None
        self._armed = float("inf")  # when the loop's timer fires (monotonic)
        self._pushed = 0  # since the last purge

    def __len__(self) -> int:
        return len(self._heap)

    def call_at(self, when: float, expire: Expire, future: asyncio.Future[Any]) -> None:
        """At monotonic time ``when``, ``expire(future)`` unless ``future`` is done."""
        heap = self._heap
        heapq.heappush(heap, (when, next(self._order), expire, future))
        if when < self._armed:
            self._arm(when)
        self._pushed += 1
        if self._pushed > _PURGE_AT and 2 * self._pushed > len(heap):
            self._purge()  # (after len/2 pushes: its cost is spread over them)

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed = when
        loop = self._loop
        self._timer = loop.call_at(loop.time() + max(when - time.monotonic(), 0.0), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._armed = float("inf")
        heap, now = self._heap, time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, expire, future = heapq.heappop(heap)
            if not future.done():
                expire(future)
        self._drop_done()
        if heap:
            self._arm(heap[0][0])

    def _drop_done(self) -> None:
        """Deadlines at the top whose futures are done need no timer of their own."""
        heap = self._heap
        while heap and heap[0][3].done():
            heapq.heappop(heap)

    def _purge(self) -> None:
        """Drop every deadline whose future is done (answered long before its deadline), so
        that a long budget or patience does not keep thousands of them alive."""
        self._pushed = 0
        live = [entry for entry in self._heap if not entry[3].done()]
        if len(live) < len(self._heap):
            heapq.heapify(live)
            self._heap[:] = live


#: A loop sweeps its heap of answered deadlines only after this many new ones (and more than
#: half of its size) since the last sweep: rarely, and never for a handful.
_PURGE_AT = 1024

#: By loop; a closed loop's are dropped when another loop makes its own (``loops``).
_LOOPS: dict[asyncio.AbstractEventLoop, Deadlines] = {}


def of(loop: asyncio.AbstractEventLoop) -> Deadlines:
    """The running loop's deadlines (made on first use)."""
    global _last
    last = _last
    if last is not None and last._loop is loop:  # the usual case: one loop, found at once
        return last
    deadlines = _last = of_loop(_LOOPS, loop, Deadlines)
    return deadlines


_last: Deadlines | None = None


def settle(future: asyncio.Future[None]) -> None:
    """The usual ``expire``: the waiter wakes and looks for itself what came."""
    future.set_result(None)
