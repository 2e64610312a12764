"""User code as a user types it, checked by ``mypy --strict`` (``tests/test_public_typing.py``):
callbacks, observers and signal receivers that name the lock they are given as ``Lock``. The
engine's lower layers name the handle only through protocols of their own
(``tests/test_engine_layout.py``); what a user writes against the public names must still check.
A line that must be refused carries ``# type: ignore[...]``: were it accepted, the ignore would be
unused, an error under ``--strict``. Never run, only checked."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, assert_type

from django.dispatch import receiver

from django_redlock import redlock
from django_redlock.engine import Lock, LockLost, LockNotAcquired, NodeFailure, Redlock
from django_redlock.engine.base.events import NullObserver
from django_redlock.signals import lock_acquired, lock_lost


def on_lost(lock: Lock, error: LockLost) -> None:
    print(lock.resource, error)


def on_lost_of_an_int(lock: int, error: LockLost) -> None:
    print(lock, error)


class Recorder:
    """An observer of its own, naming the lock as ``Lock`` in every method."""

    def acquired(self, lock: Lock, *, waited: float, attempts: int) -> None: ...
    def not_acquired(self, lock: Lock, *, waited: float, error: LockNotAcquired) -> None: ...
    def released(self, lock: Lock, *, held: float) -> None: ...
    def lost(self, lock: Lock, *, error: LockLost) -> None: ...
    def masters_failed(
        self, lock: Lock, *, action: str, failures: Sequence[NodeFailure]
    ) -> None: ...


class Counting(NullObserver):
    """The do-nothing observer, one event heard, its lock named ``Lock``."""

    def acquired(self, lock: Lock, *, waited: float, attempts: int) -> None:
        print(lock.resource, waited, attempts)


@receiver(lock_lost)
def told_lost(sender: Any, lock: Lock, error: LockLost, **kwargs: Any) -> None:
    print(lock.resource, error)


@receiver(lock_acquired)
def told_acquired(sender: Any, lock: Lock, **kwargs: Any) -> None:
    print(lock.resource)


def main() -> None:
    engine = Redlock(["redis://127.0.0.1:1"], observer=Recorder())
    Redlock(["redis://127.0.0.1:1"], observer=Counting())
    Redlock(["redis://127.0.0.1:1"], observer=NullObserver())
    Redlock(["redis://127.0.0.1:1"], observer=object())  # type: ignore[arg-type]
    engine.observer.lost(engine.lock("x"), error=LockLost("x", "gone"))

    lock = engine.lock("x", ttl=5, on_lost=on_lost)
    assert_type(lock.on_lost, Callable[[Lock, LockLost], None] | None)
    engine.lock("x", on_lost=on_lost_of_an_int)  # type: ignore[arg-type]
    permit = engine.lock("p", limit=2, on_lost=on_lost)
    assert_type(permit.on_lost, Callable[[Lock, LockLost], None] | None)
    made = Lock(engine, "z", ttl=5, wait=0, on_lost=on_lost)
    Lock(engine, "z", ttl=5, wait=0, on_lost=on_lost_of_an_int)  # type: ignore[arg-type]
    callback = made.on_lost
    if callback is not None:
        callback(made, LockLost("z", "gone"))

    with redlock("y", on_lost=on_lost) as held:
        assert_type(held, Lock)
    redlock("y", on_lost=on_lost_of_an_int)  # type: ignore[arg-type]

    @engine.locked("report:{user_id}", on_lost=on_lost)
    def report(user_id: int) -> int:
        return user_id

    assert_type(report(1), int)
