"""A lock handle's fields (``Lock``'s): its resources, its keys on the masters, its TTL, wait
and options, each checked when it is made (``ValueError`` naming a bad one, before any network
call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from . import options, protocol
from .callers import Callers
from .options import Options, WithOptions

if TYPE_CHECKING:
    from .errors import LockLost
    from .lock import Lock
    from .redlock import Redlock


class Handle(WithOptions):
    """The fields of a ``Lock``, checked."""

    # Slots: no __dict__ per handle held (a mode's subclass has one for its own fields).
    __slots__ = (
        "__weakref__", "_callers", "_options", "_redlock", "key", "keys", "resource", "resources",
        "ttl", "wait",
    )  # fmt: skip

    def __init__(
        self,
        redlock: Redlock,
        *resources: str,
        ttl: float,
        wait: float,
        label: str | None = None,
        auto_extend: bool = False,
        max_extensions: int | None = None,
        max_hold: float | None = None,
        reentrant: bool = False,
        on_lost: Callable[[Lock, LockLost], None] | None = None,
        at_least: float | None = None,
        at_most: float | None = None,
    ) -> None:
        resources = protocol.check_resources(resources)
        if redlock.clustered:  # (every handle, whoever makes it: ``Redlock.lock``, ``redlock()``)
            redlock.check_resources(resources)
        checked, ttl = options.checked(
            redlock.check_ttl(ttl),  # (within max_ttl, if set)
            label=label,
            auto_extend=auto_extend,
            max_extensions=max_extensions,
            max_hold=max_hold,
            reentrant=reentrant,
            on_lost=on_lost,
            at_least=at_least,
            at_most=at_most,
        )
        wait = protocol.check_seconds("wait", wait, allow_zero=True)
        keys = tuple(map(redlock.lock_key, resources))
        self._assemble(redlock, resources, keys, ttl, wait, checked)

    def _assemble(
        self,
        redlock: Redlock,
        resources: tuple[str, ...],
        keys: tuple[str, ...],
        ttl: float,
        wait: float,
        options: Options,
    ) -> None:
        """Set the fields of a handle on ``resources`` (checked), whose keys on the masters are
        ``keys``."""
        self._redlock = redlock
        # ``resource``: the name (several: joined with " + "), for messages, events and metrics;
        # ``keys``: the keys on the masters; ``key`` names them as one.
        self.resources = resources
        self.keys = keys
        self.resource = " + ".join(resources)
        self.key = " + ".join(keys)
        self._options = options
        self.ttl = ttl
        self.wait = wait
        self._callers = Callers()
