"""Whether a master that no longer holds our lease restarted since it granted it: what a release
must know before it counts "gone" there as a confirmation.

A release asked again on a new connection (its first connection broke before the reply) that
finds our key gone may have removed it with the first request (a reset connection: a release
done), or the master may have restarted empty since the grant (a restart breaks every
connection too: then our lease went with it, and another owner may have taken the lock there).
Only the master's identity tells them apart, and only in that rare case is it asked: one
``INFO server`` round, never on a release whose replies came on the first try.

The rule: the master's process started after the lease was granted (its ``uptime_in_seconds``,
whole seconds rounded down, is less than the lease's age): it restarted since, and our lease is
gone there. Started before the grant: the reset rule holds (the first request removed it).
Within INFO's one-second rounding of the grant, or no answer: it cannot tell, and the release is
not confirmed there (never a confirmation on a guess). With quarantine on, a member whose new
``run_id`` or replication id was seen after the grant abstains: its answer is a failed vote,
read here as "gone" (``quarantine.Watch.changed_at``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from .errors import NodeFailure
from .leases import Lease
from .quarantine import REASON as ABSTAINS
from .quarantine import parse_uptime
from .rounds import Reply, RoundReplies
from .steps import Masters, Procedure, Round

#: The request that says how long a master's process has been up (and which one it is).
INFO_SERVER = ("INFO", "server")


def restarted_since(
    masters: Masters, lease: Lease, which: Sequence[int]
) -> Procedure[dict[int, NodeFailure]]:
    """Per master of ``which`` whose "gone" is not a confirmation: why (``gone``: it restarted
    after the grant; ``error``: it cannot tell). One round, for the release's rare path."""
    replies: list[Reply] = yield Round(INFO_SERVER)
    age = time.monotonic() - lease.acquired_at  # (read after the replies: never under-counted)
    verdicts: dict[int, NodeFailure] = {}
    for i in which:
        node, reply = masters.nodes[i], replies[i]
        uptime = None if node.routed or isinstance(reply, NodeFailure) else parse_uptime(reply)
        if uptime is None:
            verdicts[i] = NodeFailure(
                node.label,
                "error",
                "asked again after its connection broke, it no longer held our lease, and it "
                "could not say whether it restarted since the grant: not counted as confirmed",
            )
        elif uptime + 1 <= age:
            verdicts[i] = NodeFailure(
                node.label,
                "gone",
                f"restarted since the grant (up {uptime:.0f} s, the lease {age:.1f} s old): our "
                f"lease went with it",
            )
        elif uptime < age:
            verdicts[i] = NodeFailure(
                node.label,
                "error",
                f"asked again, it no longer held our lease, and it started within a second of "
                f"the grant (up {uptime:.0f} s, the lease {age:.1f} s old): it may have "
                f"restarted since; not counted as confirmed",
            )
    return verdicts


def abstained_since(
    masters: Masters, lease: Lease, replies: Sequence[Reply]
) -> dict[int, NodeFailure]:
    """Per abstaining member (quarantine) whose identity changed after the grant: that it
    restarted or failed over since, so our lease is not there."""
    verdicts: dict[int, NodeFailure] = {}
    for i, reply in enumerate(replies):
        if not isinstance(reply, NodeFailure) or reply.reason != ABSTAINS:
            continue
        watch = masters.nodes[i].watch
        if watch is not None and watch.changed_at > lease.acquired_at:
            verdicts[i] = NodeFailure(
                reply.node, "gone", f"restarted or failed over since the grant ({watch.reason})"
            )
    return verdicts


def read_release(
    masters: Masters, lease: Lease, answered: RoundReplies, several: int
) -> Procedure[tuple[list[Reply], dict[int, NodeFailure]]]:
    """The release's replies, read with the masters' identities (``restarts``): a master asked
    again (its connection broke before the first reply) that finds none of our keys may well
    have applied the first request, a release done: it confirms, unless it restarted since the
    grant (its "gone" is then our lease lost there) or cannot tell (not confirmed there). An
    abstaining member whose new identity was seen after the grant: gone. Also the verdicts."""
    asked = answered.asked_again
    verdicts = abstained_since(masters, lease, answered) if masters.quarantine else {}
    suspects = [i for i in asked if answered[i] == 0]
    if suspects:
        verdicts.update((yield from restarted_since(masters, lease, suspects)))
    replies: list[Reply] = []
    for i, reply in enumerate(answered):
        verdict = verdicts.get(i)
        if verdict is not None:
            replies.append(0 if verdict.reason == "gone" else verdict)
        elif reply == 0 and i in asked:
            replies.append(several)  # a reset connection: the first request removed it
        else:
            replies.append(reply)
    return replies, verdicts
