"""How a lock's names become keys on the masters: ``<prefix><kind>:<name><suffix>``, the kind
(``lock``, ``fence``, ``queue``, ``readers``...) before the name and a key's own suffix (a permit
slot's ``#i``, a reader's ``@reader:...``) after it, so that one name's keys differ only outside
it. With a Redis Cluster member the name is spelled with a hash tag (``cluster.tagged``): all of
one lock's keys then hash to one slot, and its scripts run on one shard."""

from __future__ import annotations

from . import cluster


class KeySpace:
    """The key-building half of a ``Redlock``: its ``key_prefix``, whether it has a Cluster
    member (``clustered``), and ``lock_prefix``/``fence_prefix`` (what every lock key and fence
    counter starts with, whatever the spelling: for listing them)."""

    key_prefix: str
    clustered: bool
    lock_prefix: str
    fence_prefix: str

    def spelled(self, resource: str) -> str:
        """``resource`` as its keys spell it: as written, or with a Cluster member hash-tagged
        (``cluster.tagged``); the same again for a name already spelled (one listed)."""
        return cluster.tagged(resource) if self.clustered else resource

    def key(self, kind: str, resource: str, suffix: str = "") -> str:
        """The key of ``kind`` (lock, fence, queue, readers...) of ``resource``; ``suffix``
        names a key of its own (a permit slot, a reader) that stays in the name's hash slot."""
        return f"{self.key_prefix}{kind}:{self.spelled(resource)}{suffix}"

    def lock_key(self, resource: str) -> str:
        return self.key("lock", resource)

    def fence_key(self, resource: str) -> str:
        return self.key("fence", resource)

    def queue_key(self, resource: str) -> str:
        """The sorted set of waiters for ``resource`` on each master (see ``scripts``)."""
        return self.key("queue", resource)
