"""What a semaphore's permit (``permit_lock``) and a reader (``readers``) share: a ``Lock`` that
is one holder among several of one name, so every acquisition is a holder of its own, never a
re-entry, and the name is one resource."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..algorithm.procedures import Want
from ..leases.leases import Owner
from .lock import Lock

if TYPE_CHECKING:
    from ..algorithm.steps import Procedure
    from ..base.errors import LockContended, LockNotAcquired
    from ..handles.fields import Engine

W = TypeVar("W", bound=Want)


class GroupLock(Lock):
    """One holder of a name that several hold at once (``holder``: "permit", "reader")."""

    #: What one acquisition is, what a second one through the same handle does, what the name
    #: is, and the suffix of the handle's ``key`` (its holders are never looked up by it).
    holder: ClassVar[str]
    second: ClassVar[str]
    group: ClassVar[str]
    key_suffix: ClassVar[str]

    def __init__(self, redlock: Engine, *resources: str, option: str, **options: Any) -> None:
        """``option``: how the caller asked for it (``limit=3``, ``shared=True``), for errors."""
        if options.get("reentrant"):
            raise ValueError(
                f"{option} with reentrant=True: a {self.holder} is not re-entered (a second "
                f"acquisition {self.second}); pass one or the other"
            )
        super().__init__(redlock, *resources, **options)
        if len(self.resources) > 1:
            raise ValueError(
                f"{option} with several resources {self.resources!r}: {self.group} is one name"
            )
        self.key = f"{self.key}{self.key_suffix}"

    def _explaining(self, want: Want, error: LockNotAcquired) -> Procedure[LockContended] | None:
        return None  # (a mode's procedure words its own refusals: ``permits``, ``readers``)

    def _reenter(self, owner: Owner) -> bool:
        if self._callers.get(owner) is not None:
            raise RuntimeError(
                f"a {self.holder} of {self.resource!r} is already acquired through this object "
                f"by this thread/task; use one object per {self.holder}"
            )
        return False

    def _want_of(self, owner: Owner, kind: type[W], **fields: Any) -> W:
        """The plain lock's ``Want`` for ``owner``, as a ``kind`` with the holder's ``fields``."""
        plain = super()._want(owner)
        return kind(
            plain.resource, plain.resources, plain.keys, plain.ttl, plain.wait, plain.value,
            plain.parts, **fields,
        )  # fmt: skip
