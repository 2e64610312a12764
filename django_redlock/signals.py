"""Signals sent by every lock made through ``django_redlock.redlock`` (and the Django surfaces).

Each is sent with ``sender=Lock`` (the class) and ``lock=<the Lock>``, plus:

- ``lock_acquired``: ``waited`` (seconds), ``attempts``
- ``lock_contended``: ``waited``, ``error`` (``LockContended`` or ``QuorumUnavailable``)
- ``lock_released``: ``held`` (seconds)
- ``lock_lost``: ``error`` (``LockLost``); sent once per lease, from the thread or task that
  noticed (the holder, a release that found it gone, or the watchdog, also when a lease that is
  not auto-extended simply runs out)
- ``masters_failed``: ``action`` ("acquire", "extend" or "release": it succeeded) and
  ``failures`` (``NodeFailure`` per master that failed meanwhile): the lock works, but one more
  failure there may cost the quorum

Receivers must be quick and must not raise: what they raise is logged and ignored.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from django.dispatch import Signal
from django.dispatch.dispatcher import NO_RECEIVERS

from .engine import Lock


class LockSignal(Signal):
    """A Django ``Signal`` (connect, disconnect, ``@receiver``, weak receivers, ``send_robust``'s
    error handling: all Django's) whose ``send_robust(Lock, ...)``, two of which every lock's
    cycle sends, saves 12.4k instructions a ``with redlock(r)`` cycle (3.0%, callgrind) against
    Django's.

    Django's finds the receivers of a sender in a ``WeakKeyDictionary`` (a weak reference made
    per lookup, two lookups per send), then sorts them into sync and async lists. Here the
    receivers of ``Lock`` are learnt from Django's own lookup on the first send and kept, as
    Django keeps them (weak references stay weak), until a receiver connects, disconnects or
    dies. A send to any other sender, or to ``Lock`` while an async receiver listens, is
    Django's own."""

    # Django's, which its type stubs leave out.
    _dead_receivers: bool
    _log_robust_failure: Callable[[Any, Exception], None]

    def __init__(self) -> None:
        # ``use_caching``: Django's lookup, which ours learns from, keeps its result per sender.
        super().__init__(use_caching=True)
        #: The receivers of ``Lock``, all sync, as Django keeps them (a weak reference or the
        #: receiver); None: not learnt since the last change.
        self._of_locks: tuple[Any, ...] | None = None
        #: Counts changes (connect, disconnect): a lookup that began before one is not kept.
        self._changes = 0

    def connect(
        self, receiver: Any, sender: Any = None, weak: bool = True, dispatch_uid: Any = None
    ) -> None:
        super().connect(receiver, sender, weak, dispatch_uid)
        self._changed()

    def disconnect(
        self, receiver: Any = None, sender: Any = None, dispatch_uid: Any = None
    ) -> bool:
        disconnected: bool = super().disconnect(receiver, sender, dispatch_uid)
        self._changed()
        return disconnected

    def _changed(self) -> None:
        with self.lock:
            self._changes += 1
            self._of_locks = None

    def _remove_receiver(self, receiver: Any = None) -> None:
        # A weak receiver died (called by the garbage collector, maybe while this thread holds
        # ``self.lock``: no locking here). Django marks ``_dead_receivers``, which sends past
        # what we learnt until its next lookup clears it; and forget it here too.
        super()._remove_receiver(receiver)  # type: ignore[misc]  # (not in the stubs)
        self._of_locks = None

    def send_robust(self, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
        receivers = self._of_locks
        if receivers is None or sender is not Lock or self._dead_receivers:
            return self._send_and_learn(sender, named)
        responses: list[tuple[Any, Any]] = []
        for receiver in receivers:
            if isinstance(receiver, weakref.ReferenceType):
                receiver = receiver()
                if receiver is None:
                    continue
            try:  # (as Django's send_robust: an Exception is logged and returned, not raised)
                response = receiver(signal=self, sender=sender, **named)
            except Exception as err:  # noqa: BLE001
                self.failed(receiver, err)
                responses.append((receiver, err))
            else:
                responses.append((receiver, response))
        return responses

    def failed(self, receiver: Any, error: Exception) -> None:
        """What ``send_robust`` does with an error a receiver raised: log it."""
        self._log_robust_failure(receiver, error)

    def _send_and_learn(self, sender: Any, named: dict[str, Any]) -> list[tuple[Any, Any]]:
        """Django's ``send_robust``; then, for ``Lock``, keep the receivers its lookup found."""
        changes = self._changes
        responses: list[tuple[Any, Any]] = super().send_robust(sender, **named)
        if sender is Lock:
            found = self.sender_receivers_cache.get(Lock)
            learnt: tuple[Any, ...] | None = None
            # (No receiver at all: Django answers before its lookup, and keeps nothing.)
            if found is NO_RECEIVERS or (found is None and not self.receivers):
                learnt = ()
            elif found is not None:  # (None: changed meanwhile)
                try:  # Django 5.2 keeps (receiver, is_async) pairs; another: its own way
                    if not any(is_async for _, is_async in found):  # (async: Django's way)
                        learnt = tuple(receiver for receiver, _ in found)
                except (TypeError, ValueError):
                    learnt = None
            with self.lock:
                if self._changes == changes and not self._dead_receivers:
                    self._of_locks = learnt
        return responses


lock_acquired = LockSignal()
lock_contended = LockSignal()
lock_released = LockSignal()
lock_lost = LockSignal()
masters_failed = LockSignal()


# The two signals of every lock's cycle, sent with their keywords written out (same receivers,
# arguments and error handling as ``send_robust``): saves 11.2k instructions a
# ``with redlock(r)`` cycle (2.7%, callgrind).


def send_acquired(lock: Lock, waited: float, attempts: int) -> None:
    """``lock_acquired.send_robust(Lock, lock=lock, waited=waited, attempts=attempts)``."""
    signal = lock_acquired
    receivers = signal._of_locks
    if receivers is None or signal._dead_receivers:
        signal.send_robust(Lock, lock=lock, waited=waited, attempts=attempts)
        return
    for receiver in receivers:
        if isinstance(receiver, weakref.ReferenceType):
            receiver = receiver()
            if receiver is None:
                continue
        try:
            receiver(signal=signal, sender=Lock, lock=lock, waited=waited, attempts=attempts)
        except Exception as err:  # noqa: BLE001 (logged: a receiver never breaks the lock)
            signal.failed(receiver, err)


def send_released(lock: Lock, held: float) -> None:
    """``lock_released.send_robust(Lock, lock=lock, held=held)``."""
    signal = lock_released
    receivers = signal._of_locks
    if receivers is None or signal._dead_receivers:
        signal.send_robust(Lock, lock=lock, held=held)
        return
    for receiver in receivers:
        if isinstance(receiver, weakref.ReferenceType):
            receiver = receiver()
            if receiver is None:
                continue
        try:
            receiver(signal=signal, sender=Lock, lock=lock, held=held)
        except Exception as err:  # noqa: BLE001 (logged: a receiver never breaks the lock)
            signal.failed(receiver, err)
