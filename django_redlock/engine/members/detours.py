"""A Redis Cluster shard's answers that send a round's request elsewhere, or later, followed
within the request's budget by ``rounds._vote`` (a plain master never gives them):

- ``MOVED``: the slot has another owner (the member's map is corrected); ``ASK``: one request's
  detour during a migration (``ASKING`` goes before it on the target). The request goes there,
  once, and ``nodes[i]`` becomes that shard: its quarantine is the one that counts.
- ``TRYAGAIN``: a multi-key request whose keys a migration under way is splitting between the
  two shards (on the ``ASK`` target, or on the source with Redis 7): asked once more, on the
  same shard, after ``TRY_AGAIN_AFTER`` (the migration moves keys in batches of milliseconds).

Which is why a round waits for a shard's reply even once it is decided, and never tells a silent
shard without waiting (``rounds.exchange``): a redirection read by no one drops its request, and
a release then leaves its key on the slot's new owner for the whole TTL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import AskError, MovedError, TryAgainError

from .connections import Node
from .pipes import Pipe

#: How long a request a shard answered ``TRYAGAIN`` waits before its second try.
TRY_AGAIN_AFTER = 0.005


@dataclass(frozen=True, slots=True)
class Delay:
    """A round waits for: the time to pass ``until`` (monotonic), nothing else."""

    until: float


#: ``rounds._ask`` and ``rounds._connect`` (this module comes before ``rounds``).
Ask = Callable[..., Generator[Any, Any, object]]
Connect = Callable[[Node, float], Generator[Any, Any, object]]


def follow(
    nodes: list[Node],
    i: int,
    pipe: Pipe,
    reply: object,
    request: Any,
    budget: float,
    ask: Ask,
    connect: Connect,
) -> Generator[Any, Any, tuple[Pipe, object, bool]]:
    """(the pipe, the reply, whether an ASK detour) once ``reply`` of ``nodes[i]`` is followed;
    the reply is a ``NodeFailure`` if the shard it names could not be reached."""
    node, asking = nodes[i], False
    if isinstance(reply, TryAgainError):
        yield Delay(time.monotonic() + TRY_AGAIN_AFTER)
        reply = yield from ask(node, pipe, request, budget)
    if isinstance(reply, MovedError | AskError) and (target := node.redirected(reply)):
        nodes[i] = node = target
        made = yield from connect(node, budget)
        if not isinstance(made, Pipe):
            return pipe, made, asking
        pipe, asking = made, isinstance(reply, AskError)
        reply = yield from ask(node, pipe, request, budget, asking=asking)
        if isinstance(reply, TryAgainError):
            yield Delay(time.monotonic() + TRY_AGAIN_AFTER)
            reply = yield from ask(node, pipe, request, budget, asking=asking)
    return pipe, reply, asking


__all__: Sequence[str] = ("TRY_AGAIN_AFTER", "Delay", "follow")
