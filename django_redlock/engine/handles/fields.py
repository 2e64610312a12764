"""A lock handle's fields (``Lock``'s): its resources, its keys on the masters, its TTL, wait
and options, each checked when it is made (``ValueError`` naming a bad one, before any network
call); and the two ways to make one: ``Lock(...)`` checks everything, ``checked_apart`` only the
resources, for a caller that checked the rest once for many handles."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, Self

from ..algorithm.steps import Masters
from ..base import protocol
from ..leases.callers import Callers
from . import options
from .options import Options, WithOptions

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..base.errors import LockLost
    from ..base.events import Observer
    from ..leases.reentry import Holders
    from ..running.watchdog import Watchdog


class Engine(Masters, Protocol):
    """What a handle and its kinds need of the ``Redlock`` it locks over: the procedures' needs
    (``Masters``), how its names become keys, its checks, the leases it holds, its watchdog and
    its observer."""

    key_prefix: str
    lock_prefix: str
    clustered: bool
    holders: Holders

    @property
    def watchdog(self) -> Watchdog: ...
    #: (``Observer[Lock]``, named above: a handle is told to it as ``self``.)
    @property
    def observer(self) -> Observer[Any]: ...

    def spelled(self, resource: str) -> str: ...
    def key(self, kind: str, resource: str, suffix: str = "") -> str: ...
    def lock_key(self, resource: str) -> str: ...
    def check_ttl(self, ttl: object) -> float: ...
    def check_resources(self, resources: Sequence[str]) -> None: ...


class Handle(WithOptions):
    """The fields of a ``Lock``, checked."""

    # Slots: no __dict__ per handle held (a mode's subclass has one for its own fields).
    __slots__ = (
        "__weakref__", "_callers", "_options", "_redlock", "key", "keys", "resource", "resources",
        "ttl", "wait",
    )  # fmt: skip

    def __init__(
        self,
        redlock: Engine,
        *resources: str,
        ttl: float,
        wait: float,
        label: str | None = None,
        auto_extend: bool = False,
        max_extensions: int | None = None,
        max_hold: float | None = None,
        reentrant: bool = False,
        on_lost: Callable[[Self, LockLost], None] | None = None,
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

    @classmethod
    def checked_apart(
        cls,
        redlock: Engine,
        resources: tuple[str, ...],
        key_prefix: str,
        ttl: float,
        wait: float,
        options: Options,
    ) -> Self:
        """A handle on ``resources`` (checked here: ``ValueError`` naming a bad one) whose
        ``ttl``, ``wait`` and ``options`` were checked beforehand for this ``redlock``, as
        ``__init__`` checks them, and whose keys are ``key_prefix`` (``redlock.lock_prefix``)
        + each resource as its keys spell it (``redlock.spelled``): for a caller that checks
        one set of options once for many handles (the Django layer's ``redlock()``).
        ``options`` may be shared: a handle whose option is set gets a record of its own
        (``options.option``). For a plain lock, or a subclass whose ``__init__`` makes nothing
        more (not a permit or a reader)."""
        if redlock.clustered:  # (as ``__init__``; the member's rule for the keys' hash tags)
            redlock.check_resources(resources)
        resources = protocol.check_resources(resources)
        keys = tuple(key_prefix + redlock.spelled(r) for r in resources)
        lock = object.__new__(cls)
        lock._assemble(redlock, resources, keys, ttl, wait, options)
        return lock

    def _assemble(
        self,
        redlock: Engine,
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
