"""A lock's options (``label``, ``auto_extend``, ``max_extensions``, ``max_hold``, ``reentrant``,
``on_lost``, ``at_least``, ``at_most``): checked once, and kept as one immutable record that every
lock left with the defaults shares.

Why a record: a handle is made per ``with redlock(r):`` and kept while held, and most locks leave
every option at its default. Eight fields of their own cost each held lock 64 bytes; a pointer to
the shared defaults costs 8. The handle's attributes of the same names read the record
(``option``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Self

from ..base import protocol

if TYPE_CHECKING:
    from ..base.errors import LockLost


@dataclass(slots=True, kw_only=True, eq=False)  # (eq=False: compared by identity, DEFAULTS)
class Options:
    """The options of one lock (or of every lock that has the defaults: ``DEFAULTS``)."""

    label: str | None = None
    auto_extend: bool = False
    max_extensions: int | None = None
    max_hold: float | None = None
    reentrant: bool = False
    #: Called with the handle whose option it is (typed on the handle: ``WithOptions.on_lost``;
    #: a record may be shared by handles of several kinds).
    on_lost: Callable[[Any, LockLost], None] | None = None
    at_least: float | None = None
    at_most: float | None = None


DEFAULTS = Options()


def checked(
    ttl: float,
    *,
    label: object,
    auto_extend: object,
    max_extensions: object,
    max_hold: object,
    reentrant: object,
    on_lost: object,
    at_least: object,
    at_most: object,
) -> tuple[Options, float]:
    """The options, checked (``ValueError`` naming a bad one, before any network call), and the
    lock's TTL under them (``at_most`` caps it); ``DEFAULTS`` itself when they are the defaults."""
    least, most = protocol.check_hold_bounds(at_least, at_most)
    ttl, hold = protocol.capped_by(most, ttl, max_hold)
    checked_label = protocol.check_label(label)
    extensions = protocol.check_count("max_extensions", max_extensions)
    if on_lost is not None and not callable(on_lost):
        raise ValueError(f"on_lost must be callable, got {on_lost!r}")
    if (
        checked_label is None
        and not auto_extend
        and extensions is None
        and hold is None
        and not reentrant
        and on_lost is None
        and least is None
        and most is None
    ):
        return DEFAULTS, ttl
    options = Options(
        label=checked_label,
        auto_extend=bool(auto_extend),
        max_extensions=extensions,
        max_hold=hold,
        reentrant=bool(reentrant),
        on_lost=on_lost,
        at_least=least,
        at_most=most,
    )
    return options, ttl


#: Held while a handle's option is set (copied into a record of its own): the options of one
#: handle set from several threads at once all stay set. Setting an option is rare; one lock
#: serves every handle (the Django layer's options too: ``locks.DjangoLock``).
WRITING = threading.Lock()


def option(name: str) -> Any:
    """A handle's attribute ``name``, read from its ``_options`` (a property whose getter runs
    in C: nearly as cheap to read as an attribute of its own). Setting it (unchecked, as setting
    the attribute always was) gives the handle a record of its own: ``DEFAULTS`` is everyone's,
    and a record of other options may be shared by many handles (``Lock.checked_apart``)."""

    def write(lock: Any, value: object) -> None:
        with WRITING:  # (a read, a copy and a write: two threads at once would lose one)
            lock._options = replace(lock._options, **{name: value})

    return property(attrgetter(f"_options.{name}"), write, doc=f"The lock's ``{name}`` option.")


class WithOptions:
    """A handle's options as its attributes (``lock.label``, ``lock.auto_extend``...), read from
    the record in its ``_options`` slot."""

    __slots__ = ()

    label: str | None = option("label")
    auto_extend: bool = option("auto_extend")
    max_extensions: int | None = option("max_extensions")
    max_hold: float | None = option("max_hold")
    reentrant: bool = option("reentrant")
    on_lost: Callable[[Self, LockLost], None] | None = option("on_lost")
    at_least: float | None = option("at_least")
    at_most: float | None = option("at_most")
