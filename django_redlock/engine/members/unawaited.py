"""Replies a round stopped waiting for: those a quorum had decided it without (``unawaited``),
and those of a wait that was interrupted (``abandon_waiting``). Each stays in its pipe's queue,
abandoned: its reply is read and dropped when it comes, never handed to another round."""

from __future__ import annotations

import time
from collections.abc import Callable

from ..base.errors import NodeFailure, unawaited_failure
from .connections import Node
from .packing import Requests
from .pipes import Pipe
from .slots import ANSWERS, PENDING, Slot


def unawaited(node: Node, pipe: Pipe, slot: Slot, requests: Requests) -> NodeFailure:
    """A reply the round did not wait for: a quorum had already decided it. The master is not
    blamed (not silent, no timeout: we chose not to wait); its reply is not a vote when it comes
    (``_settle_late``). Whatever the request does there meanwhile is ours to undo, and is undone
    in order: a failed acquisition's release, or the holder's, goes later on this same pipe, and
    the master applies it after the request it follows."""
    pipe.abandon(slot)
    script = requests.script
    if script is not None and not slot.keeps_late:
        slot.on_late = _settle_late(node, pipe, requests, resend=not script.acked)
    return unawaited_failure(node.label)


def _settle_late(
    node: Node, pipe: Pipe, requests: Requests, *, resend: bool
) -> Callable[[object], None]:
    """What a script's late reply still teaches: an answer, that the master has the script (else
    every request there carries its source again); NOSCRIPT, that it never ran. With ``resend``
    (a script that grants nothing: a release, a read) it is sent again with its source: a late
    compare-and-delete cannot remove a newer holder's key. A grant is never resent late."""

    def settle(reply: object) -> None:
        if type(reply) in ANSWERS:
            requests.answered(node)
        elif requests.forgot_script(node, pipe, reply) and resend:
            again = pipe.send(requests.with_source(), time.monotonic())
            if again is not None:
                pipe.abandon(again)

    return settle


def abandon_waiting(sent: list[tuple[Pipe, Slot]]) -> None:
    """A wait interrupted (Ctrl-C, a cancelled task): replies still to come are dropped when they
    come (the pipes are shared: closing one would break every other round on it)."""
    for pipe, slot in sent:
        if slot.reply is PENDING:
            pipe.abandon(slot)
