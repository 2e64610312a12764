"""``Redlock``: a set of independent masters and the lock settings shared by every lock on them."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .algorithm.markers import is_marker, limit_of
from .algorithm.steps import Procedure, Round
from .base import protocol
from .base.errors import LockLost, NodeFailure, NotLocked, QuorumUnavailable
from .base.events import NullObserver, Observer
from .base.values import MAX_VALUE_BYTES, Owner, UnreadableValue, fingerprint, parse_value
from .kinds.lock import Lock
from .kinds.modes import check_mode, member_keys
from .leases.leases import current_owner, describe
from .leases.reentry import Holders
from .locking import locking
from .members import cluster
from .members.connections import Node, NodeSpec
from .members.keyspace import KeySpace
from .members.packing import Command
from .members.rounds import Reply
from .members.shards import ClusterMember
from .running.drivers import arun, run
from .running.watchdog import WATCHDOG
from .scripts import plain as plain_scripts
from .waiting.admission import Admission
from .waiting.local_queues import LocalQueues
from .waiting.notices import ReleaseNotices

DEFAULT_KEY_PREFIX = "redlock:"

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Holder:
    """Who holds a resource: the owner its value names (empty if the value is not one of ours),
    on how many masters, and a short fingerprint of its token (never the token); for a key of
    another type than a string, which blocks acquisitions as a lock does, its type in angle
    brackets (``"<hash>"``)."""

    resource: str
    owner: Owner
    masters: int
    fingerprint: str
    #: A name held as a semaphore ("permits", with its ``limit``) or by readers ("readers"):
    #: each permit's or reader's own holder, in ``holders``; "lock" otherwise.
    mode: str = "lock"
    limit: int | None = None
    holders: tuple[Holder, ...] = ()


def holder_of(masters: Redlock, resource: str, replies: Sequence[Reply]) -> Holder | None:
    """From each master's ``scripts.plain.PEEK`` reply: the holder a quorum of masters agrees on, or
    None when no one can hold ``resource`` on a quorum, even if every master that did not answer
    held it. Raises ``QuorumUnavailable`` when those masters could make the difference: "cannot
    tell" is never reported as "free". A semaphore's or readers' marker: a ``Holder`` whose
    ``mode`` says so (its permits or readers are read next, by ``Redlock.holder``)."""
    occupants: Counter[tuple[int, bytes]] = Counter()
    free = 0
    for reply in replies:
        if reply == 0:
            free += 1
        elif isinstance(reply, list) and len(reply) == 2:
            occupants[(int(reply[0]), bytes(reply[1]))] += 1
    unanswered = len(replies) - free - sum(occupants.values())
    most = 0
    if occupants:
        (length, head), most = occupants.most_common(1)[0]
        if most >= masters.quorum and is_marker(head.decode("latin-1")):
            text = head.decode("latin-1")
            mode = "readers" if limit_of(text) is None else "permits"
            return Holder(resource, Owner(), most, "", mode, limit_of(text))
        if most >= masters.quorum:
            owner, print_ = _identify(length, head)
            return Holder(resource, owner, most, print_)
    if most + unanswered >= masters.quorum:
        raise QuorumUnavailable(
            resource,
            f"cannot tell whether {resource!r} is held: {unanswered} of {len(replies)} masters "
            f"did not answer, and the others agree on no holder ({masters.quorum} needed either "
            f"way)",
            [r for r in replies if isinstance(r, NodeFailure)],
        )
    return None


def _as_peek(value: Reply) -> Reply:
    """An MGET answer as ``scripts.plain.PEEK`` gives it: 0 for no key, else [length, head]."""
    if isinstance(value, bytes):
        return [len(value), value[:MAX_VALUE_BYTES]]
    return 0 if value is None else value


def _identify(length: int, head: bytes) -> tuple[Owner, str]:
    """The owner and fingerprint of a value of ``length`` bytes whose start is ``head`` (-1: a
    key of another type, ``head`` naming it)."""
    if length < 0:
        return Owner(), f"<{head.decode('ascii', 'replace')}>"
    try:
        print_, owner = parse_value(head, size=length)
    except UnreadableValue:
        return Owner(), fingerprint(head.partition(b":")[0])
    return owner, print_


def check_bounds_for(mode: type[Lock], at_least: object, at_most: object) -> None:
    """``at_least``/``at_most`` keep or cut one holder's lock: a plain lock (``check_mode``'s
    ``Lock``), not permits or readers; ``ValueError`` naming them otherwise."""
    if mode is not Lock and (at_least is not None or at_most is not None):
        raise ValueError(
            f"at_least={at_least!r}/at_most={at_most!r} keep or cut one holder's lock: they "
            f"do not apply to limit= or shared=True"
        )


def duplicate_masters(specs: Sequence[NodeSpec]) -> list[str]:
    """The entries that name a redis-server already named (by host and port or socket path,
    loopback however spelled, whatever the db number; a Cluster member by any of its seeds)."""
    found = protocol.duplicate_servers([(spec.label, spec.identity) for spec in specs])
    named = [(spec.label, address) for spec in specs for address in cluster.servers_named(spec)]
    return found + [d for d in protocol.duplicate_servers(named) if d not in found]


class Redlock(KeySpace):
    """Locks over N independent Redis masters. Django-free: give it URLs or ``NodeSpec``s.

    >>> locks = Redlock(["redis://127.0.0.1:7001", "redis://127.0.0.1:7002", "redis://127.0.0.1:7003"])
    >>> with locks.lock("invoice:42", ttl=10, wait=5) as lock:  # doctest: +SKIP
    ...     lock.validity
    """

    def __init__(
        self,
        nodes: Sequence[str | NodeSpec],
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        ttl: float = 30.0,
        wait: float = 0.0,
        node_timeout: float = 0.05,
        drift_factor: float = 0.01,
        retry_delay: float = 0.1,
        observer: Observer[Lock] | None = None,
        max_ttl: float | None = None,
        quarantine: bool = False,
    ) -> None:
        """``max_ttl``: the longest TTL any lock (or extension) may have; a longer one is a
        ``ValueError``. ``quarantine`` (needs ``max_ttl``): a member that restarted, failed over,
        or has been up less than ``max_ttl`` abstains from votes until every lease it may have
        lost has run out (see ``quarantine``)."""
        if isinstance(nodes, str | bytes) or not nodes:
            raise ValueError(f"nodes must be a non-empty list of URLs, got {nodes!r}")
        specs = [n if isinstance(n, NodeSpec) else NodeSpec.from_url(n) for n in nodes]
        duplicates = duplicate_masters(specs)
        if duplicates:
            # The same master twice would vote twice: a "quorum" of one real master.
            raise ValueError(f"nodes listed more than once: {'; '.join(duplicates)}")
        if not isinstance(key_prefix, str):
            raise ValueError(f"key_prefix must be a str, got {key_prefix!r}")
        self.key_prefix = key_prefix
        #: Each process's waiters are woken by name on its channel ``<this><inbox id>``.
        self.inbox_prefix = f"{key_prefix}wake:"
        self.max_ttl = None if max_ttl is None else protocol.check_ttl(max_ttl)
        if quarantine and self.max_ttl is None:
            raise ValueError("quarantine needs max_ttl: how long a member that may have lost "
                             "keys must abstain")  # fmt: skip
        self.quarantine = bool(quarantine)
        self.ttl = self.check_ttl(ttl)
        self.wait = protocol.check_seconds("wait", wait, allow_zero=True)
        self.node_timeout = protocol.check_seconds("node_timeout", node_timeout, allow_zero=False)
        protocol.check_node_timeout(self.node_timeout, self.ttl)
        self.drift_factor = protocol.check_seconds("drift_factor", drift_factor, allow_zero=True)
        if self.drift_factor >= 1:
            raise ValueError(f"drift_factor must be below 1, got {drift_factor!r}")
        self.retry_delay = protocol.check_seconds("retry_delay", retry_delay, allow_zero=False)
        self.observer: Observer[Lock] = observer or NullObserver()
        watch = self.max_ttl if self.quarantine else None
        self.nodes = tuple(
            (ClusterMember if spec.seeds is not None else Node)(
                spec, self.node_timeout, max_ttl=watch
            )
            for spec in specs
        )
        #: A Redis Cluster member routes each request by its keys' hash slot: names are spelled
        #: with a hash tag in every key (``spelled``), one per lock (``check_resources``).
        self.clustered = any(spec.seeds is not None for spec in specs)
        self.lock_prefix, self.fence_prefix = f"{key_prefix}lock:", f"{key_prefix}fence:"
        if self.clustered:
            cluster.check_hash_tags(key_prefix, ())
        self.quorum = protocol.quorum(len(self.nodes))
        self.watchdog = WATCHDOG
        #: Leases held in this process, under each of their keys: how re-entry is recognized.
        self.holders = Holders()
        # Made now (cheap: its keeper thread starts on the first wait), so that no lock is
        # needed to make it lazily; a lock a thread held at a fork() would stay held in the child.
        self._notices = ReleaseNotices(self.nodes, self.quorum, self.inbox_prefix)
        #: This process's waiters, per resource, in arrival order (one competes on the masters).
        self.queues = LocalQueues()
        #: At most ``admission.IN_FLIGHT`` rounds of this engine on the masters at once, per
        #: event loop and for its threads; further acquisitions wait their turn in order.
        self.admission = Admission()
        self._courtesy: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<Redlock {len(self.nodes)} masters, quorum {self.quorum}>"

    def check_ttl(self, ttl: object) -> float:
        """``ttl`` if it is a valid lease length within ``max_ttl``, else ``ValueError``."""
        checked = protocol.check_ttl(ttl)
        if self.max_ttl is not None and checked > self.max_ttl:
            raise ValueError(f"ttl {ttl!r} is over max_ttl={self.max_ttl!r}")
        return checked

    def lock(
        self,
        *resources: str,
        ttl: float | None = None,
        wait: float | None = None,
        label: str | None = None,
        auto_extend: bool = False,
        max_extensions: int | None = None,
        max_hold: float | None = None,
        reentrant: bool = False,
        on_lost: Callable[[Lock, LockLost], None] | None = None,
        at_least: float | None = None,
        at_most: float | None = None,
        limit: int | None = None,
        shared: bool = False,
    ) -> Lock:
        """A lock on ``resources`` (not yet acquired: use it in ``with``/``async with``).
        Several resources make one lock: all of them or none, on each master, in one round.

        ``limit=N``: one of N permits of a semaphore (``permits``); ``shared=True``: a reader
        of a readers/writer lock, beside other readers (the plain lock is its writer).

        ``auto_extend``: a watchdog renews the lease at a third of its TTL until released
        (optionally at most ``max_extensions`` times, or for ``max_hold`` seconds in all).
        ``reentrant``: the owning thread/task may acquire it again; it is released when the
        outermost block exits. ``on_lost(lock, error)`` is called (once, from the thread that
        noticed) when the lease is lost while held. ``at_least`` (seconds): a block that ends
        sooner leaves the lock held, unrenewed, until then, so that a copy of the job on a host
        whose clock is late finds it taken; ``at_most``: the lease never reaches past it (a hung
        holder frees the lock then, and is told: ``on_lost``, ``LockLost``); both for an
        exclusive lock only."""
        mode = check_mode(limit, shared, reentrant)
        check_bounds_for(mode, at_least, at_most)
        return mode(
            self,
            *resources,
            ttl=self.ttl if ttl is None else ttl,
            wait=self.wait if wait is None else wait,
            label=label,
            auto_extend=auto_extend,
            max_extensions=max_extensions,
            max_hold=max_hold,
            reentrant=reentrant,
            on_lost=on_lost,
            at_least=at_least,
            at_most=at_most,
            **({} if limit is None else {"limit": limit}),
        )

    def locked(self, *resources: str, **options: Any) -> Callable[[F], F]:
        """A decorator: run the function holding ``lock(*resources, **options)``, each
        resource formatted from the call's arguments (``"report:{user_id}"``); sync or async."""
        return locking(lambda: self, resources, options)

    def assert_locked(self, resource: str) -> None:
        """Raise ``NotLocked`` unless the calling thread or task holds ``resource`` now (a lock, a
        permit, a reader; ``LockLost`` if its lease ran out). Local, no request to the masters:
        for code that must only ever run guarded (ShedLock's ``LockAssert``)."""
        resource = protocol.check_resource(resource)
        owner = current_owner()
        leases = self.holders.of(owner, (self.lock_key(resource),))
        lease = (leases and leases[0]) or self.holders.under(owner, resource)  # (or a permit's)
        if lease is None:
            raise NotLocked(
                resource, f"lock {resource!r} is not held by {describe(owner)}, which needs it"
            )
        if lease.check_lost():
            raise LockLost(resource, lease.lost_message())

    def holder(self, resource: str) -> Holder | None:
        """Who holds ``resource`` now, as a quorum of masters says (one round); None if no one
        holds it on a quorum. Raises ``QuorumUnavailable`` when too few masters answered to
        tell (a lock held on a bare quorum, one of whose masters is down, is neither). Values
        are read capped at ``MAX_VALUE_BYTES``: another program's huge value costs no more than
        ours. A semaphore's or readers' name: its permits or readers too (``holders``; one or
        two rounds more)."""
        return run(self, self._holder(resource))

    async def aholder(self, resource: str) -> Holder | None:
        return await arun(self, self._holder(resource))

    def _holder(self, resource: str) -> Procedure[Holder | None]:
        replies: list[Reply] = yield Round(self._peek(resource), plain_scripts.PEEK)
        held = holder_of(self, resource, replies)
        if held is None or held.mode == "lock":
            return held
        names, keys = yield from member_keys(self, resource, held.limit)
        if not names:
            return replace(held, holders=())
        values = yield Round(("MGET", *keys))
        members = []
        for i, name in enumerate(names):
            peeked = [_as_peek(r[i]) if isinstance(r, list) else r for r in values]
            try:
                members.append(holder_of(self, name, peeked))
            except QuorumUnavailable:
                continue  # a member too few masters answered for: not listed
        return replace(held, holders=tuple(m for m in members if m is not None))

    def is_locked(self, resource: str) -> bool:
        """Whether anyone holds ``resource`` on a quorum of masters (one round). Raises
        ``QuorumUnavailable`` when too few masters answered to tell, rather than guess."""
        return self.holder(resource) is not None

    async def ais_locked(self, resource: str) -> bool:
        return await self.aholder(resource) is not None

    def check_resources(self, resources: Sequence[str]) -> None:
        """With a Redis Cluster member: ``ValueError`` unless the keys of ``resources`` share one
        hash slot (``cluster.check_hash_tags``: a script runs on one shard; one resource always
        does, its name being tagged in its keys: ``spelled``). Why not fan out per
        slot instead: the member's vote must be all of its resources or none, as a plain
        member's one script gives; granted per slot, a shard failing between two scripts would
        leave partial grants to undo, and two lockers could each hold part of a set and both
        fail. One slot keeps one script, one shard, one atomic vote."""
        if self.clustered:
            cluster.check_hash_tags(self.key_prefix, resources)

    def _peek(self, resource: str) -> Command:
        self.check_resources((resource,))
        key = self.lock_key(protocol.check_resource(resource))
        return plain_scripts.PEEK.evalsha((key,), (MAX_VALUE_BYTES,))

    def release_command(
        self,
        resources: Sequence[str],
        value: str | bytes,
        *,
        notify: bool = True,
        queued_as: str = "",
    ) -> tuple[Command, plain_scripts.Script]:
        """The request (and the script it runs) that releases ``resources`` on one master where
        it still holds ``value`` (compare-and-delete, then a notice that wakes the next waiter
        of each resource unless ``notify`` is false). Used by every release: the holder's own,
        the undoing of a failed attempt (quietly: it freed nothing anyone was waiting for, and
        must not cost a waiter its place in the queue), and the admin's force release of
        exactly the holder it showed. ``queued_as``: the waiter id the holder had, if it
        waited: its queue entries go too."""
        # (One resource written out: saves 5.1k instructions a cycle, 1.2%; kept for issue 37's
        # budget.)
        if len(resources) == 1:
            script, resource = plain_scripts.RELEASE, resources[0]
            keys: tuple[str, ...] = (self.lock_key(resource), self.queue_key(resource))
        else:
            script = plain_scripts.MULTI_RELEASE
            keys = (*map(self.lock_key, resources), *map(self.queue_key, resources))
        if notify:
            args = (value, "1", protocol.notice_digest(value), self.inbox_prefix, queued_as)
        else:
            args = (value, "", "", "", queued_as)
        return script.evalsha(keys, args), script

    @property
    def notices(self) -> ReleaseNotices:
        """Release notices for waiters; its keeper thread starts on first wait."""
        return self._notices

    def give_way(self, resource: str, seconds: float) -> None:
        """Our release woke waiters: keep this process out of ``resource`` for ``seconds``."""
        if len(self._courtesy) > 10_000:  # bounded: stale entries of resources never seen again
            self._courtesy.clear()
        self._courtesy[resource] = time.monotonic() + seconds

    def courtesy_until(self, resource: str) -> float:
        return self._courtesy.get(resource, 0.0)

    def close(self) -> None:
        """Stop the release-notice keeper and close the connections (the threads' and every
        event loop's)."""
        notices = self._notices
        self._notices = ReleaseNotices(self.nodes, self.quorum, self.inbox_prefix)  # if used again
        notices.close()
        for node in self.nodes:
            node.close()
