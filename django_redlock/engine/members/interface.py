"""What the algorithm may know of the members: the types a procedure names and reads, and the
one question it asks about a member's server (``changed_since``), never a connection to use.
``algorithm/`` imports from ``members/`` only through here (``tests/test_engine_layout.py``
holds it to that), so that "the algorithm does no I/O" is checked, not a matter of discipline."""

from __future__ import annotations

from .connections import Node
from .packing import Command
from .quarantine import REASON as ABSTAINS
from .rounds import Reply, RoundReplies
from .shards import ClusterMember

__all__ = ["ABSTAINS", "Command", "Node", "Reply", "RoundReplies", "changed_since"]


def changed_since(node: Node, when: float) -> bool | None:
    """Whether ``node``'s connections found a new server process after ``when`` (monotonic);
    None: it cannot tell. A Cluster member: any shard we talk to (our keys are on those)."""
    if not isinstance(node, ClusterMember):
        return node.server.changed_since(when)
    known = [c for c in (s.server.changed_since(when) for s in node.shards) if c is not None]
    return any(known) if known else None
