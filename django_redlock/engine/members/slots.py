"""A request's place in a pipe's queue (``pipes``): the ``Slot`` its reply fills, ``PENDING``
until then, or ``Broken`` if the pipe broke first."""

from __future__ import annotations

from collections.abc import Callable, Sequence

#: What a slot holds until its reply comes.
PENDING = object()

#: Reply types that are plain answers (not an error reply, a broken pipe, or no reply yet).
ANSWERS = frozenset({bytes, int, list, type(None)})


class Broken:
    """A slot's answer when its pipe broke before the reply came (not a reply of the master)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Slot:
    """One request's place in a pipe's queue; ``reply`` is PENDING until its answer is read.

    Made as ``Slot()``, then stamped (``sent_at``): its other fields start as the class's
    defaults (not ``__slots__`` and an ``__init__``: saves 7.6k instructions a cycle of ten
    slots, 1.8%; kept for issue 37's budget). Slots live only while their request is in flight,
    so the instance dict costs no held lock anything."""

    #: Monotonic time the request left (an async pipe stamps it at the flush): the master's
    #: budget runs from here, not from when the round began, so that a busy client (a thousand
    #: rounds queued on one event loop) is not taken for a slow master.
    sent_at: float = 0.0
    reply: object = PENDING
    abandoned: bool = False
    #: Called with the slot (in the reading thread) when the reply came: how an async round
    #: learns it.
    on_reply: Callable[[Slot], None] | None = None
    #: Called with the reply (in the reading thread) when it comes after the slot was given up
    #: on: how a round that returned at quorum still learns what a slow master said.
    on_late: Callable[[object], None] | None = None
    #: Whether its reply is still stored once given up on (read by no round, but by the slot
    #: itself: see ``acks``); else it is dropped.
    keeps_late = False


def stamped(now: float) -> Slot:
    """A new slot whose request left at ``now``."""
    slot = Slot()
    slot.sent_at = now
    return slot


def oldest(queue: Sequence[Slot]) -> Slot | None:
    """The oldest slot of a pipe's queue, or None, read once: another thread reading the pipe
    may take its last slot between a test for emptiness and a read of ``queue[0]``."""
    try:
        return queue[0]
    except IndexError:
        return None
