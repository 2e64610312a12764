"""A round's request, packed once in each form it is sent in: the command's RESP bytes, and for
a script, EVAL with its source for a master not known to have it (``Requests``)."""

from __future__ import annotations

from typing import Any

import hiredis
from redis.exceptions import NoScriptError

from . import acks
from .connections import Node
from .pipes import Pipe
from .scripts import Script
from .slots import Slot

#: One Redis command: name then arguments.
Command = tuple[Any, ...]


def pack(command: Command) -> bytes:
    """RESP bytes of ``command``, by hiredis directly (our arguments are already str, bytes or
    numbers). A round sends the same bytes to every master: packed once, not once per master."""
    return hiredis.pack_command(command)  # type: ignore[no-any-return]


class Requests:
    """One round's request, packed once in each form it is sent in."""

    def __init__(self, command: Command, script: Script | None) -> None:
        self.command = command
        self.script = script
        #: The script's SHA (None: no script), which a master that answered is known to have.
        self.warm_sha = None if script is None else script.sha
        self._packed = pack(command)
        #: The request with the script's source, once a master needed it (else None).
        self.sourced: bytes | None = None

    def for_node(self, node: Node) -> bytes:
        if self.warm_sha is None or self.warm_sha in node.warm:
            return self._packed
        return self.with_source()

    def with_source(self) -> bytes:
        """The script request as EVAL with the script's source (no NOSCRIPT possible)."""
        if self.sourced is None:
            assert self.script is not None  # noqa: S101
            self.sourced = pack(("EVAL", self.script.source, *self.command[2:]))
        return self.sourced

    def forgot_script(self, node: Node, pipe: Pipe, reply: object) -> bool:
        """Whether ``reply`` says the master lost our script (flushed, restarted)."""
        if self.script is not None and isinstance(reply, NoScriptError):
            node.warm.discard(self.script.sha)
            pipe.scripts.discard(self.script.sha)
            return True
        return False

    def answered(self, node: Node) -> None:
        if self.warm_sha is not None:
            node.warm.add(self.warm_sha)

    def send(self, node: Node, pipe: Pipe, now: float, preamble: bytes = b"") -> Slot | None:
        """Write the request on ``node``'s ``pipe`` (see ``Pipe.send``); followed by ``WAIT`` in
        the same write where the member's replicas must acknowledge it (``acks``). A script
        goes with its source only to a master not known to have it, and not sent it on this
        connection yet: Redis runs one connection's requests in order, so the first one loads
        it for every later one there (a cold burst sent its source with every request until
        the first answer came)."""
        sha = self.warm_sha
        if sha is None or sha in node.warm or sha in pipe.scripts:
            sourced, request = False, self._packed
        else:
            sourced, request = True, self.with_source()
        if node.acks is not None and acks.wanted(self.command, self.script):
            slot = node.acks.send(pipe, request, now, preamble)
        elif preamble:
            slot = pipe.send(request, now, preamble=preamble)
        else:
            slot = pipe.send(request, now)
        if sourced and slot is not None:  # (after it: a request written before it is not)
            pipe.scripts.add(sha)  # type: ignore[arg-type]
        return slot
