"""A waiter on the masters: what its process knows of it (its name in the masters' queues, its
beacons, the masters that handed it the lock), and whose word of a hand-off counts."""

from __future__ import annotations

from ..base.beacon import Beacon
from ..members.connections import Node
from ..members.quarantine import abstains


class Waiter:
    """One waiter. ``notified`` fires when a release names it (it is first in a master's queue);
    ``subscribed`` once enough masters confirmed the inbox subscription that no notice can be
    missed."""

    def __init__(self, waiter_id: str) -> None:
        #: How this waiter is named in the masters' waiter queues: "<inbox id>.<n>".
        self.id = waiter_id
        self.notified = Beacon()
        self.subscribed = Beacon()
        #: The masters whose release handed this waiter the lock (``scripts.wake``) and whose
        #: word counts as a vote (``votes_by_word``): filled by ``notices``, read by
        #: ``handoff.handed_over``.
        self.handed: set[Node] = set()
        #: When the first of them said so, of the latest release to hand it the lock
        #: (monotonic): a quorum's word is awaited for at most a node budget from then, by its
        #: reader (``ReleaseNotices.wait_notice``) and then ``handoff.handed_over``.
        self.first_handed = float("inf")
        #: Its place in the masters' queues (one resource): when it stops waiting, in ms of the
        #: Unix epoch (``scripts.ACQUIRE_WAITING``).
        self.score: int | None = None
        #: When its first queued attempt began (monotonic): a lease a release hands it began
        #: later. None before it queued.
        self.queued_since: float | None = None
        #: False once it undid an attempt after it queued: a hand-off that the undo removed may
        #: be told after it, so from then on a hand-off is only a hint (its next round confirms).
        self.trusts_hand_offs = True
        #: It waits on an event loop: the keeper thread reads for it.
        self.asynchronous = False


def votes_by_word(node: Node) -> bool:
    """Whether a master's word that its release handed a waiter the lock counts as its vote
    (unless it abstains at the time: quarantine): not for a member whose votes need more than
    its own write (replica acknowledgement), or whose notices may come from another server than
    its rounds reach (Sentinel, Cluster). Those confirm a hand-off by a round, as any lock is
    taken. (Fixed for a member: its ``Inbox`` asks once.)"""
    spec = node.spec
    return spec.ack is None and spec.service is None and spec.seeds is None


def votes_left(handed: set[Node]) -> int:
    """How many of the masters that handed a waiter the lock count as its votes now: not those
    that began to abstain since their word came."""
    # (A copy: the reader may add to it meanwhile.)
    return sum(not abstains(node) for node in tuple(handed))
