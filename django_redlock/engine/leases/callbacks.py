"""Callbacks off the renewal path: what the watchdog notices (a lease lost, masters that failed
during a renewal) is told to ``on_lost`` and the observer (Django's ``lock_lost`` and
``masters_failed`` receivers, metrics, logs) from a thread of its own, in order, one at a time.

Why: user code is slow in ways a lock cannot bound (a receiver that sends an e-mail, a metrics
exporter that times out). On the watchdog's thread, one three-second ``on_lost`` would hold back
every other lease's renewal for three seconds, and short leases would be lost for it. A queue
costs a few microseconds and decouples them. Any other thread (the holder's) tells at once, as
before: there the caller is the one who noticed, and waits for its own callback.

After ``fork()`` the child starts with an empty queue and no thread: it tells nothing its parent
noticed.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from ..base.events import logger


class Dispatcher:
    """Runs callbacks at once, or (from a thread that asked to defer them) on its own thread."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._queue: queue.SimpleQueue[
            tuple[Callable[..., None], tuple[Any, ...], dict[str, Any]]
        ] = queue.SimpleQueue()
        self._local = threading.local()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None

    def defer_here(self) -> None:
        """From now on, callbacks asked for by the calling thread run on the dispatcher's."""
        self._local.deferring = True

    def call(self, callback: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """``callback(*args, **kwargs)``: now, or queued if the calling thread defers them."""
        if not getattr(self._local, "deferring", False):
            callback(*args, **kwargs)
            return
        self._queue.put((callback, args, kwargs))
        if self._thread is None:
            with self._guard:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="redlock-callbacks", daemon=True
                    )
                    self._thread.start()

    def _run(self) -> None:
        while True:
            callback, args, kwargs = self._queue.get()
            try:
                callback(*args, **kwargs)
            except Exception:  # noqa: BLE001 (the callbacks' own guards log; this is the last)
                logger.exception("django_redlock callback failed")
            del callback, args, kwargs  # not kept alive (a lock handle) until the next one


#: The process's dispatcher.
DISPATCHER = Dispatcher()
