"""A round's request, packed once in each form it is sent in: the command's RESP bytes, and for
a script, EVAL with its source for a master not known to have it (``Requests``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hiredis
from redis.exceptions import NoScriptError

from ..scripts.plain import Script
from . import acks
from .connections import Node
from .pipes import Pipe
from .slots import Slot

#: One Redis command: name then arguments.
Command = tuple[Any, ...]


#: RESP bytes of a command, by hiredis directly (our arguments are already str, bytes or
#: numbers). A round sends the same bytes to every master: packed once, not once per master.
#: (hiredis's function itself, not a Python function calling it: a frame fewer every round.)
pack: Callable[[Command], bytes] = hiredis.pack_command


class Requests:
    """One round's request, packed once in each form it is sent in."""

    def __init__(
        self, command: Command, script: Script | None, packed: bytes | None = None
    ) -> None:
        self.command = command
        self.script = script
        #: The script's SHA (None: no script), which a master that answered is known to have.
        self.warm_sha = None if script is None else script.sha
        #: The request's RESP bytes (by SHA, for a script): ``packed`` if the round packed it.
        self.packed = pack(command) if packed is None else packed
        #: The request with the script's source, once a master needed it (else None).
        self.sourced: bytes | None = None

    def for_node(self, node: Node, pipe: Pipe | None = None) -> bytes:
        """The request as ``node`` takes it: by SHA where the master is known to have the
        script, or was sent its source on ``pipe`` already (Redis runs one connection's requests
        in order, so the first loads it for every later one there); else with its source."""
        sha = self.warm_sha
        if sha is None or sha in node.warm or (pipe is not None and sha in pipe.scripts):
            return self.packed
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

    def send(
        self, node: Node, pipe: Pipe, now: float, preamble: bytes = b"", *, probed: bool = False
    ) -> Slot | None:
        """Write the request on ``node``'s ``pipe`` (see ``Pipe.send``); followed by ``WAIT`` in
        the same write where the member's replicas must acknowledge it (``acks``), in the form
        ``for_node`` picks (a cold burst used to send a script's source with every request
        until a first answer came). A member unsure of its scripting (``scripting``: a new
        connection's first requests) is written to through its ``Scripting.send``."""
        if node.scripting.unsure and not probed:
            return node.scripting.send(
                pipe, self.command, lambda: self.send(node, pipe, now, preamble, probed=True)
            )
        request = self.for_node(node, pipe)
        if node.acks is not None and acks.wanted(self.command, self.script):
            slot = node.acks.send(pipe, request, now, preamble)
        elif preamble:
            slot = pipe.send(request, now, preamble=preamble)
        else:
            slot = pipe.send(request, now)
        if request is self.sourced and slot is not None:  # (only once written: not before)
            pipe.scripts.add(self.warm_sha)  # type: ignore[arg-type]
        return slot
