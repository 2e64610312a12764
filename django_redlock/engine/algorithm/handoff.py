"""The hand-off: a release gives the lock to the waiter at the head of the resource's queue on
each master (``scripts.plain.wake``), and a waiter that a quorum of masters told so holds it
without a round of its own. What a queue entry carries for that, and when a waiter may count the
masters' word as the lock (``handed_over``); ``procedures.acquire`` waits and asks."""

from __future__ import annotations

import time
from typing import Protocol

from ..base import protocol
from ..scripts import plain as plain_scripts
from ..waiting.waiter import Waiter, votes_left
from .steps import AwaitNotice, Masters, Procedure


class Queued(Protocol):
    """What a queue entry says of an acquisition's request (a ``procedures.Want``)."""

    @property
    def several(self) -> bool: ...
    @property
    def ttl(self) -> float: ...
    @property
    def value(self) -> str: ...


def queued_as(want: Queued, waiter: Waiter) -> str:
    """How ``waiter`` is named in the masters' queues: marked when it waits for several resources,
    so that a key's turn is never passed on to it (see
    ``scripts.plain.MULTI_ACQUIRE_WAITING``); else with its TTL and value, so that a release can
    hand it the lock (``scripts.plain.wake``)."""
    if want.several:
        return waiter.id + plain_scripts.SEVERAL_MARK
    return f"{waiter.id} {int(want.ttl * 1000)} {want.value}"


def handed_over(masters: Masters, ttl: float, waiter: Waiter) -> Procedure[float | None]:
    """Until when the lock is ours (monotonic) if releases handed ``waiter`` the lock on a
    quorum of masters: ours without a round of our own, and no one could take it between the
    release and us (no barging). Woken by the first master's word, it awaits a quorum's for at
    most one node budget from that word (a release reaches every master at once; its reader may
    have spent some of it reading on: ``ReleaseNotices.wait_notice``); fewer: its queues split the
    release's keys among waiters, and its round (which loses, and undoes them, or wins) settles
    it. The lease on each began after our first queued attempt began (``queued_since``), so the
    validity counts from there; too little left (a long wait), or a hand-off that only hints
    (``trusts_hand_offs``): None, and the next round takes the lock where it was handed to us
    as well as where it is free."""
    since = waiter.queued_since
    # (A waiter for several resources is never handed a key: its queue entries carry no value.)
    if since is None or not waiter.handed or not waiter.trusts_hand_offs:
        return None
    until = waiter.first_handed + masters.node_timeout
    while votes_left(waiter.handed) < masters.quorum:
        left = until - time.monotonic()
        if left <= 0:
            return None
        yield AwaitNotice(waiter, left)
    valid_until = since + ttl - protocol.drift(ttl, masters.drift_factor)
    return None if valid_until - time.monotonic() < ttl / 2 else valid_until
