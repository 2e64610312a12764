"""Local waiter queues: inside one process, the waiters of one resource queue up, first come first
served, and only the one at the head competes on the masters (as their queued waiter, woken by
release notices: ``notices``), so that a thousand local waiters cost one network waiter and get
the lock in the order they came."""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque

from ..base.beacon import Beacon


class Turn:
    """One local waiter's place in the queue of each of its resources; ``ready`` fires when it
    is first in all of them."""

    __slots__ = ("ready", "resources")

    def __init__(self, resources: tuple[str, ...]) -> None:
        self.resources = resources
        self.ready = Beacon()


class LocalQueues:
    """The waiters of each resource in this process, in arrival order. A waiter whose turn it is
    (first in the queue of each of its resources) competes on the masters (as their queued
    waiter); when it leaves (it got the lock, gave up or was interrupted), the next one's turn
    may come.

    A lock over several resources joins all their queues at once, under one guard: every two
    waiters then stand in the same order in every queue they share, so the oldest waiter is
    always first in all of its queues, and no two wait for each other (whatever the order in
    which they named their resources)."""

    def __init__(self) -> None:
        self._new_process()
        _QUEUES.add(self)

    def _new_process(self) -> None:
        self._guard = threading.Lock()
        self._queues: dict[str, deque[Turn]] = {}

    def join(self, resources: tuple[str, ...]) -> Turn:
        turn = Turn(resources)
        with self._guard:
            for resource in resources:
                self._queues.setdefault(resource, deque()).append(turn)
            first = self._first(turn)
        if first:
            turn.ready.fire()
        return turn

    def _first(self, turn: Turn) -> bool:
        return all(self._queues[resource][0] is turn for resource in turn.resources)

    def leave(self, turn: Turn) -> None:
        following: list[Turn] = []
        with self._guard:
            for resource in turn.resources:
                queue = self._queues.get(resource)
                if queue is None or turn not in queue:
                    continue
                was_first = queue[0] is turn
                queue.remove(turn)
                if not queue:
                    del self._queues[resource]
                elif was_first and queue[0] not in following:
                    following.append(queue[0])
            ready = [waiting for waiting in following if self._first(waiting)]
        for waiting in ready:
            waiting.ready.fire()


_QUEUES: weakref.WeakSet[LocalQueues] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # The parent's waiters do not exist in the child (and a guard held at the fork would never
    # be let go).
    for queues in list(_QUEUES):
        queues._new_process()  # noqa: SLF001 (this module's own hook)


os.register_at_fork(after_in_child=_after_fork_in_child)
