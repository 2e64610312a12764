"""A Redis Cluster member (``cluster``): one vote in the quorum, made of one ``Node`` per shard.

A round asks the member where a request goes (``ClusterMember.route``): to the shard that owns
the slot of the request's keys, on that shard's own pipelined connections (the same machinery as
a plain member: one pipe for the process's threads, one per event loop). The slot map is learnt
with ``CLUSTER SLOTS`` off the round's path, on a thread of its own: until it is known a request
goes to the first seed, and the ``MOVED`` that answers it teaches the owner of that slot at once.
``MOVED`` (the slot changed owner: the map is updated, the request asked again there) and ``ASK``
(the slot is being migrated: ``ASKING`` and the request on the target, map unchanged) are followed
by ``rounds``, once, within the request's budget. A shard that is down fails the member's vote
for the keys in its slots, under its own label (``<member> shard <host:port>``), and has the map
read again (a replica may have taken its slots over).

Quarantine (when on) watches each shard as any member: a shard that restarted or failed over
abstains, and so the member abstains for the keys it owns.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.exceptions import AskError, MovedError, ResponseError

from . import cluster
from .connections import Node, NodeSpec
from .dialing import Connected

#: Budget of one ``CLUSTER SLOTS`` read (per seed), off the round's path.
MAP_TIMEOUT = 1.0


class ShardNode(Node):
    """One primary of a cluster member: a plain ``Node`` whose redirections its member follows."""

    redirects = True

    @property
    def silent_until(self) -> float:
        """Never left out of a round as silent (``rounds.SKIP_SILENT_FOR``): a silent master is
        told its request without waiting, and a shard's ``MOVED``/``ASK`` would then be read
        by no one (``detours``)."""
        return 0.0

    @silent_until.setter
    def silent_until(self, value: float) -> None:
        pass

    def __init__(
        self, member: ClusterMember, spec: NodeSpec, timeout: float, *, max_ttl: float | None
    ) -> None:
        super().__init__(spec, timeout, max_ttl=max_ttl)
        self.member = member
        if self.watch is not None:
            self.watch.distrust_promotion = True  # (see ``Watch.distrust_promotion``)

    def redirected(self, error: ResponseError) -> Node | None:
        return self.member.redirect(error)

    def _open(self, budget: float) -> Connected:
        """A connection to this primary; if it cannot be made, the member reads the slot map
        again (in the background): a primary that died may have been replaced by a promoted
        replica elsewhere, and no one will answer MOVED for its slots from here."""
        try:
            return super()._open(budget)
        except (redis.RedisError, OSError):
            self.member.refresh_soon()
            raise


class ClusterMember(Node):
    """A Redis Cluster as one member. Its own pipes are never used: rounds go to its shards."""

    routed = True

    def __init__(self, spec: NodeSpec, timeout: float, *, max_ttl: float | None = None) -> None:
        assert spec.seeds is not None  # noqa: S101
        self.seeds = spec.seeds
        self.max_ttl = max_ttl
        self.map = cluster.SlotMap()
        self._shards: dict[cluster.Address, ShardNode] = {}
        super().__init__(spec, timeout, max_ttl=None)

    def _forget(self) -> None:
        super()._forget()
        self._refreshing = False  # a thread of the parent's does not run in a forked child
        # Nor does one that held this guard when the process forked: it would stay held.
        self._shards_guard = threading.Lock()

    def __repr__(self) -> str:
        return f"<ClusterMember {self.label}>"

    def shard(self, address: cluster.Address) -> ShardNode:
        """The node of the primary at ``address`` (made on first use)."""
        node = self._shards.get(address)
        if node is None:
            with self._shards_guard:
                node = self._shards.get(address)
                if node is None:
                    host, port = address
                    spec = NodeSpec(
                        f"{self.label} shard {host}:{port}",
                        self.spec.connection_class,
                        {**self.spec.connection_kwargs, "host": host, "port": port},
                    )
                    node = ShardNode(self, spec, self.timeout, max_ttl=self.max_ttl)
                    self._shards[address] = node
        return node

    @property
    def shards(self) -> list[ShardNode]:
        return list(self._shards.values())

    def route(self, command: Sequence[Any]) -> Node:
        """The shard that owns ``command``'s slot as far as we know (the first seed until the
        map is known: its ``MOVED``, if any, tells the owner)."""
        slot = cluster.slot_of(command)
        owner = None if slot is None else self.map.owner(slot)
        if owner is None:
            self.refresh_soon()
            owner = self.seeds.addresses[0]
        return self.shard(owner)

    def redirect(self, error: ResponseError) -> Node | None:
        """Where a ``MOVED`` or ``ASK`` reply sends the request (None: not a redirection).
        ``MOVED``: that slot's owner changed; the map says so now, and is read again in the
        background (a migration usually moves many slots). ``ASK``: one request's detour during
        a migration, the map unchanged."""
        if not isinstance(error, MovedError | AskError):
            return None
        address = (error.host, int(error.port))
        if isinstance(error, MovedError):
            self.map.moved(error.slot_id, address)
            self.refresh_soon()
        return self.shard(address)

    def refresh(self, timeout: float = MAP_TIMEOUT) -> None:
        """Read the slot map now (blocking): from a primary we know, else a seed."""
        known = [a for a in self.map.primaries() if a not in self.seeds.addresses]
        reply = cluster.read_slots(
            [*self.seeds.addresses, *known],
            self.spec.connection_class,
            dict(self._kwargs),
            timeout,
        )
        self.map.learn(reply)

    def refresh_soon(self) -> None:
        """Read the slot map on a thread of its own (one at a time), never on a round's path."""
        if self._refreshing:
            return
        self._refreshing = True

        def read() -> None:
            try:
                self.refresh()
            except (redis.RedisError, OSError):
                pass  # the next unknown slot or MOVED asks again
            finally:
                self._refreshing = False

        threading.Thread(target=read, name=f"redlock-slots {self.label}", daemon=True).start()

    def primaries(self) -> list[ShardNode]:
        """Every primary of the cluster now (reads the slot map: blocking, for admin paths)."""
        self.refresh()
        return [self.shard(address) for address in self.map.primaries()]

    def close(self) -> None:
        super().close()
        for node in self.shards:
            node.close()

    def client(self, timeout: float | None = None) -> Any:
        """A redis-py ``RedisCluster`` with this member's settings, for one-off admin commands
        (inventory: SCAN on every primary; release notices). Not for the lock path."""
        kwargs = {
            k: v
            for k, v in self._kwargs.items()
            if k not in ("host", "port", "db", "protocol", "retry", "connection_class")
        }
        if timeout is not None:
            kwargs.update(socket_timeout=timeout, socket_connect_timeout=timeout)
        if issubclass(self.spec.connection_class, redis.SSLConnection):
            kwargs["ssl"] = True
            kwargs = {k: v for k, v in kwargs.items() if not k.startswith("ssl_") or k in _SSL}
        startup = [redis.cluster.ClusterNode(host, port) for host, port in self.seeds.addresses]
        return redis.cluster.RedisCluster(startup_nodes=startup, **kwargs)


#: TLS options ``RedisCluster`` takes (redis-py's names).
_SSL = frozenset({
    "ssl_keyfile", "ssl_certfile", "ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_data",
    "ssl_check_hostname", "ssl_password", "ssl_ca_path", "ssl_min_version", "ssl_ciphers",
})  # fmt: skip
