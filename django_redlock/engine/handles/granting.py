"""The lease an acquisition won: what a handle records once the masters granted it (a mode with
keys of its own, a semaphore's permit or a reader, gives its keys and commands)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base import process
from ..leases.leases import Lease, LeaseCommands, Owner

if TYPE_CHECKING:
    from ..algorithm.procedures import Won
    from .fields import Handle


def granted(
    handle: Handle,
    owner: Owner,
    value: str,
    won: Won,
    keys: tuple[str, ...] | None = None,
    commands: LeaseCommands | None = None,
    *,
    parts: tuple[bytes, str] | None = None,
) -> Lease:
    """The lease that acquisition ``won`` through ``handle`` holds for ``owner``; ``keys`` and
    ``commands``: a mode's own (a permit's slot, a reader's key), else the handle's; ``parts``:
    the value's, as made (``values.new_value``). (Its observer and ``on_lost`` are the
    handle's, read from it when they are told.)"""
    # (In ``Lease.__init__``'s order, not by keyword: saves 6.1k instructions a cycle, 1.5%;
    # kept for issue 37's budget.)
    options = handle._options  # noqa: SLF001 (the engine's handle)
    return Lease(
        handle.resources,  # resources
        handle.keys if keys is None else keys,  # keys
        handle.ttl,  # ttl
        value,  # value
        won.valid_until,  # valid_until
        owner,  # owner
        process.pid,  # pid
        handle,  # handle
        won.queued_as,  # queued_as
        options.max_extensions,  # max_extensions
        options.max_hold,  # max_hold
        commands,  # commands
        parts,  # parts
    )
