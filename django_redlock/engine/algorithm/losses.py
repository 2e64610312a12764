"""How a lease found lost is told: per master, which said our token is gone and which failed
(``gone``), and the ``LockLost`` that marks the lease lost when no quorum can hold it any more
(``taken_away``). Used by every round of a held lease: renewals, releases, finishing writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..base.errors import UNAWAITED, LockLost, NodeFailure
from ..base.protocol import Tally
from ..leases.leases import Lease
from ..members.interface import Reply
from .steps import Masters


def taken_away(masters: Masters, lease: Lease, result: Tally, replies: list[Reply]) -> LockLost:
    """So many masters no longer hold our token that no quorum can: mark the lease lost."""
    return lease.mark_lost(
        f"lock {lease.resource!r} is gone from {result.denied} of {result.total} masters: it "
        f"expired or was released by force",
        gone(masters, replies),
    )


def gone(
    masters: Masters,
    replies: Sequence[Reply],
    *,
    several: int = 1,
    known: Mapping[int, NodeFailure] | None = None,
) -> list[NodeFailure]:
    """Per master, for a lost lease: which said our token is gone, which failed; ``known``: what
    more was learnt of some of them (by index: restarted since the grant)."""
    out = []
    for i, (node, reply) in enumerate(zip(masters.nodes, replies, strict=True)):
        if isinstance(reply, NodeFailure):
            if reply.reason != UNAWAITED:
                out.append(reply)
        elif reply == 0 or (several > 1 and reply != several):
            out.append((known or {}).get(i) or NodeFailure(node.label, "gone"))
    return out
