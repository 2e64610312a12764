"""Whether a master that no longer holds our lease restarted since it granted it: what a release
must know before it counts "gone" there as a confirmation.

A release asked again on a new connection (its first connection broke before the reply) that
finds our key gone may have removed it with the first request (a reset connection: a release
done), or the master may have restarted empty since the grant (a restart breaks every
connection too: then our lease went with it, and another owner may have taken the lock there).
Its ``run_id`` tells them apart: every new connection reads it (``incarnations``), before any
round's reply on it, so the new connection the release was asked again on has already said
which process it reached. A new process seen after the grant: it restarted (or failed over)
since, and our lease is gone there. The same process: the reset rule holds (the first request
removed it). Never read (INFO refused): it cannot tell, and does not confirm. With quarantine
on, an abstaining member (whose answer is a failed vote) that restarted since the grant is gone
there too. Nothing here costs a release whose replies came on the first try: no round of its
own, only identities compared.
"""

from __future__ import annotations

from ..base.errors import NodeFailure
from ..leases.leases import Lease
from ..members.interface import ABSTAINS, Reply, RoundReplies, changed_since
from .steps import Masters


def read_release(
    masters: Masters, lease: Lease, answered: RoundReplies, several: int
) -> tuple[list[Reply], dict[int, NodeFailure]]:
    """The release's replies, read with the masters' identities: a master asked again that finds
    none of our keys confirms (``several``: what a confirmation answers), unless it restarted
    since the grant (then 0: our lease is gone there) or cannot tell (a failed vote saying so);
    an abstaining member that restarted since the grant: 0 too. And, by index, why each of
    those does not confirm."""
    asked = answered.asked_again
    verdicts: dict[int, NodeFailure] = {}
    replies: list[Reply] = []
    for i, reply in enumerate(answered):
        abstained = isinstance(reply, NodeFailure) and reply.reason == ABSTAINS
        if not abstained and not (reply == 0 and i in asked):
            replies.append(reply)
            continue
        node = masters.nodes[i]
        changed = changed_since(node, lease.acquired_at)
        if changed:
            verdicts[i] = NodeFailure(
                node.label,
                "gone",
                "restarted since the grant (a new run_id): our lease went with it",
            )
            replies.append(0)
        elif abstained:
            replies.append(reply)  # (its vote stays a failure: it may hold our key or not)
        elif changed is None:
            verdicts[i] = NodeFailure(
                node.label,
                "error",
                "asked again after its connection broke, it no longer held our lease, and it "
                "never said which server process it is (INFO refused?): not counted as confirmed",
            )
            replies.append(verdicts[i])
        else:
            replies.append(several)  # a reset connection: the first request removed it
    return replies, verdicts
