"""``Redlock``: a set of independent masters and the lock settings shared by every lock on them."""

from __future__ import annotations

from collections.abc import Sequence

from . import protocol
from .events import NullObserver, Observer
from .lock import Lock
from .nodes import Node, NodeSpec

DEFAULT_KEY_PREFIX = "redlock:"


class Redlock:
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
        observer: Observer | None = None,
    ) -> None:
        if isinstance(nodes, str | bytes) or not nodes:
            raise ValueError(f"nodes must be a non-empty list of URLs, got {nodes!r}")
        specs = [n if isinstance(n, NodeSpec) else NodeSpec.from_url(n) for n in nodes]
        labels = [s.label for s in specs]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            # The same master twice would vote twice: a "quorum" of one real master.
            raise ValueError(f"nodes listed more than once: {', '.join(duplicates)}")
        if not isinstance(key_prefix, str):
            raise ValueError(f"key_prefix must be a str, got {key_prefix!r}")
        self.key_prefix = key_prefix
        self.ttl = protocol.check_ttl(ttl)
        self.wait = protocol.check_seconds("wait", wait, allow_zero=True)
        self.node_timeout = protocol.check_seconds("node_timeout", node_timeout, allow_zero=False)
        self.drift_factor = protocol.check_seconds("drift_factor", drift_factor, allow_zero=True)
        if self.drift_factor >= 1:
            raise ValueError(f"drift_factor must be below 1, got {drift_factor!r}")
        self.retry_delay = protocol.check_seconds("retry_delay", retry_delay, allow_zero=False)
        self.observer: Observer = observer or NullObserver()
        self.nodes = tuple(Node(spec, self.node_timeout) for spec in specs)
        self.quorum = protocol.quorum(len(self.nodes))

    def __repr__(self) -> str:
        return f"<Redlock {len(self.nodes)} masters, quorum {self.quorum}>"

    def lock(
        self,
        resource: str,
        *,
        ttl: float | None = None,
        wait: float | None = None,
        label: str | None = None,
    ) -> Lock:
        """A lock on ``resource`` (not yet acquired: use it in ``with``/``async with``)."""
        return Lock(
            self,
            resource,
            ttl=self.ttl if ttl is None else ttl,
            wait=self.wait if wait is None else wait,
            label=label,
        )

    def lock_key(self, resource: str) -> str:
        return f"{self.key_prefix}lock:{resource}"

    def fence_key(self, resource: str) -> str:
        return f"{self.key_prefix}fence:{resource}"

    def close(self) -> None:
        """Close idle connections (sync ones; async ones close with their event loop)."""
        for node in self.nodes:
            node.close()
