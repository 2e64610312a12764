"""The lock signals' ``send_robust`` (``signals.LockSignal``): the receivers of ``Lock`` kept
between sends must be exactly those Django's own dispatch would call, with Django's error
handling, whatever connects, disconnects or dies between two sends. No Redis: the signals are
sent directly, as the observer sends them (real locks send them in test_signals_metrics.py)."""

from __future__ import annotations

import gc
import logging
import threading
from typing import Any

import pytest
from django.dispatch import Signal

from django_redlock.engine import Lock
from django_redlock.signals import (
    LockSignal,
    lock_acquired,
    lock_released,
    send_acquired,
    send_released,
)


class Heard:
    """Receivers that note who heard what."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def receiver(self, name: str) -> Any:
        def receive(signal: Signal, sender: object, **named: Any) -> str:
            self.calls.append((name, {"sender": sender, **named}))
            return f"{name} done"

        return receive

    def names(self) -> list[str]:
        names = [name for name, _ in self.calls]
        self.calls.clear()
        return names


def test_receivers_connected_and_disconnected_between_sends_are_heard_as_django_would():
    signal, heard = LockSignal(), Heard()
    first, second = heard.receiver("first"), heard.receiver("second")
    assert signal.send_robust(Lock, held=1.0) == []  # nobody listens: learnt as nobody
    assert signal._of_locks == ()  # (the next sends need no lookup, Django's or ours)
    assert signal.send_robust(Lock, held=1.0) == []
    signal.connect(first)
    assert signal.send_robust(Lock, held=1.0) == [(first, "first done")]
    assert signal.send_robust(Lock, held=2.0) == [(first, "first done")]  # (from what it learnt)
    assert heard.calls[-1] == ("first", {"sender": Lock, "held": 2.0})
    signal.connect(second, dispatch_uid="second")
    signal.send_robust(Lock, held=1.0)
    assert heard.names() == ["first", "first", "first", "second"]
    assert signal.disconnect(first)
    signal.send_robust(Lock, held=1.0)
    signal.send_robust(Lock, held=1.0)
    assert heard.names() == ["second", "second"]
    assert signal.disconnect(dispatch_uid="second")
    assert signal.send_robust(Lock, held=1.0) == []
    assert heard.names() == []


def test_receivers_of_another_sender_are_not_called_and_other_senders_are_djangos():
    class Other:
        pass

    signal, heard = LockSignal(), Heard()
    signal.connect(heard.receiver("locks"), sender=Lock, weak=False)
    signal.connect(heard.receiver("others"), sender=Other, weak=False)
    signal.connect(heard.receiver("any"), weak=False)
    for _ in range(2):
        signal.send_robust(Lock, held=1.0)
    assert heard.names() == ["locks", "any", "locks", "any"]
    signal.send_robust(Other, held=1.0)
    assert heard.names() == ["others", "any"]


def test_a_weak_receiver_that_dies_is_not_called_nor_kept_alive():
    signal, heard = LockSignal(), Heard()

    class Listener:
        def on_release(self, signal: Signal, sender: object, **named: Any) -> None:
            heard.calls.append(("listener", named))

    listener = Listener()
    signal.connect(listener.on_release)  # weak (Django's default): a WeakMethod
    signal.send_robust(Lock, held=1.0)
    signal.send_robust(Lock, held=1.0)
    assert heard.names() == ["listener", "listener"]
    alive = __import__("weakref").ref(listener)
    del listener
    gc.collect()
    assert alive() is None  # what the signal learnt holds it weakly, as Django does
    assert signal.send_robust(Lock, held=1.0) == []
    assert signal.send_robust(Lock, held=1.0) == []
    assert heard.names() == []


def test_a_raising_receiver_is_logged_and_returned_and_the_next_one_still_hears(
    caplog: pytest.LogCaptureFixture,
):
    signal, heard = LockSignal(), Heard()

    def broken(signal: Signal, sender: object, **named: Any) -> None:
        raise RuntimeError("receiver bug")

    after = heard.receiver("after")
    signal.connect(broken, weak=False)
    signal.connect(after, weak=False)
    for _ in range(2):  # the first send learns; the second is the kept receivers'
        caplog.clear()
        responses = signal.send_robust(Lock, held=1.0)
        assert [receiver for receiver, _ in responses] == [broken, after]
        assert isinstance(responses[0][1], RuntimeError)
        assert responses[1][1] == "after done"
        [record] = [r for r in caplog.records if r.name == "django.dispatch"]
        assert record.levelno == logging.ERROR
        assert "broken" in record.getMessage()
        assert record.exc_info is not None
        assert "receiver bug" in str(record.exc_info[1])
    assert heard.names() == ["after", "after"]


def test_an_async_receiver_is_sent_to_as_django_sends():
    """Django runs an async receiver of ``send_robust`` through ``async_to_sync``, after the sync
    ones: so it does here (never from what was learnt, which holds sync receivers only)."""
    signal, heard = LockSignal(), Heard()

    async def listening(signal: Signal, sender: object, **named: Any) -> str:
        heard.calls.append(("async", named))
        return "async done"

    sync = heard.receiver("sync")
    signal.connect(listening, weak=False)
    signal.connect(sync, weak=False)
    for _ in range(2):
        assert signal.send_robust(Lock, held=1.0) == [
            (sync, "sync done"),
            (listening, "async done"),
        ]
    assert heard.names() == ["sync", "async", "sync", "async"]


def test_a_receiver_connected_while_other_threads_send_is_heard_by_every_later_send():
    """Senders keep learning while the main thread connects and disconnects: what one of them
    learnt before a change must never outlive it."""
    signal, heard = LockSignal(), Heard()
    stop = threading.Event()

    def sending() -> None:
        while not stop.is_set():
            signal.send_robust(Lock, held=1.0)

    senders = [threading.Thread(target=sending) for _ in range(3)]
    for sender in senders:
        sender.start()
    try:
        for round_ in range(200):
            uid = f"r{round_}"
            signal.connect(heard.receiver(uid), weak=False, dispatch_uid=uid)
            heard.calls.clear()
            signal.send_robust(Lock, held=2.0)
            assert (uid, {"sender": Lock, "held": 2.0}) in heard.calls, round_
            signal.disconnect(dispatch_uid=uid)
            heard.calls.clear()
            signal.send_robust(Lock, held=3.0)
            assert not [c for c in heard.calls if c[1]["held"] == 3.0], round_
    finally:
        stop.set()
        for sender in senders:
            sender.join()


def test_a_change_right_after_the_lookup_is_not_forgotten():
    """The narrowest race, made to happen: a receiver connects (another thread, in life) just
    after a send read Django's lookup and before it kept what it found."""
    signal, heard = LockSignal(), Heard()
    late, connected = heard.receiver("late"), []
    signal.connect(heard.receiver("early"), weak=False)

    class ConnectingAfterLookup(type(signal.sender_receivers_cache)):  # type: ignore[misc]
        def get(self, key: Any, default: Any = None) -> Any:
            found = super().get(key, default)
            if key is Lock and heard.calls and not connected:  # (the lookup after the send)
                connected.append(True)
                signal.connect(late, weak=False, dispatch_uid="late")
            return found

    signal.sender_receivers_cache = ConnectingAfterLookup()
    signal.send_robust(Lock, held=1.0)  # learns (early), and "late" connects meanwhile
    signal.send_robust(Lock, held=1.0)
    assert heard.names() == ["early", "early", "late"]


@pytest.mark.parametrize("learnt", [False, True], ids=["first send", "learnt"])
def test_the_cycles_two_signals_reach_receivers_as_send_robust_would(
    learnt: bool, caplog: pytest.LogCaptureFixture
):
    """``send_acquired`` / ``send_released`` (what the observer sends on every cycle): the same
    receivers get the same arguments as from ``send_robust(Lock, ...)``; one that raises is
    logged as Django logs it and the next one still hears; sync and async receivers alike."""
    heard = Heard()
    lock = object()

    def broken(signal: Signal, sender: object, **named: Any) -> None:
        raise RuntimeError("receiver bug")

    async def listening(signal: Signal, sender: object, **named: Any) -> None:
        heard.calls.append(("async", {"signal": signal, "sender": sender, **named}))

    def recording(name: str) -> Any:
        def receive(signal: Signal, sender: object, **named: Any) -> None:
            heard.calls.append((name, {"signal": signal, "sender": sender, **named}))

        return receive

    cases = [
        (lock_acquired, lambda: send_acquired(lock, 0.25, 3), {"waited": 0.25, "attempts": 3}),
        (lock_released, lambda: send_released(lock, 1.5), {"held": 1.5}),
    ]
    for signal, send, named in cases:
        receivers = [broken, recording("sync"), listening]
        for n, receiver in enumerate(receivers):
            signal.connect(receiver, weak=False, dispatch_uid=f"case-{n}")
        try:
            for async_too in (True, False):
                if learnt:
                    signal.send_robust(Lock, lock=lock, **named)
                    heard.calls.clear()
                caplog.clear()
                send()
                expected = {"signal": signal, "sender": Lock, "lock": lock, **named}
                assert heard.calls == [("sync", expected)] + (
                    [("async", expected)] if async_too else []
                )
                heard.calls.clear()
                [record] = [r for r in caplog.records if r.name == "django.dispatch"]
                assert "receiver bug" in str(record.exc_info[1] if record.exc_info else "")
                signal.disconnect(dispatch_uid="case-2")  # (and again without the async one)
        finally:
            for n in range(len(receivers)):
                signal.disconnect(dispatch_uid=f"case-{n}")


def test_a_receiver_cache_kept_another_way_leaves_the_sends_to_django(monkeypatch):
    """Our ``send_robust`` learns the receivers from Django 5.2's cache, ``(receiver, is_async)``
    pairs. A Django that keeps them another way (here: triples, which this Django's own send
    reads back as pairs): every send still reaches the receivers, by Django's own way, and
    nothing raises."""
    signal = LockSignal()
    heard = Heard()
    signal.connect(heard.receiver("one"), weak=False)
    djangos = Signal.send_robust

    def send_keeping_triples(self: Signal, sender: Any, **named: Any) -> Any:
        cache = self.sender_receivers_cache
        if isinstance(cache.get(sender), list):
            cache[sender] = [(receiver, is_async) for receiver, is_async, _ in cache[sender]]
        responses = djangos(self, sender, **named)
        if isinstance(cache.get(sender), list):
            cache[sender] = [(receiver, is_async, "new") for receiver, is_async in cache[sender]]
        return responses

    monkeypatch.setattr(Signal, "send_robust", send_keeping_triples)
    for _ in range(3):
        assert [r for _, r in signal.send_robust(Lock, lock=None)] == ["one done"]
    assert heard.names() == ["one"] * 3
