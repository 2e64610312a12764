"""Who is connected: the lock-path connections one process has on each master, and its open file
descriptors, counted from outside that process (so that counting costs it nothing).

On each master, ``CLIENT LIST`` entries whose client port is one of the process's TCP sockets
(``/proc/<pid>/fd`` -> ``socket:[inode]`` -> ``/proc/<pid>/net/tcp``), less the pub/sub ones
(``sub``/``psub``/``ssub`` > 0, or a subscribe command), which are counted apart. The census's own
admin connections belong to the benchmark process, never to the one counted.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import redis

PUBSUB_COMMANDS = {"subscribe", "psubscribe", "ssubscribe"}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def tcp_ports(pid: int) -> set[int]:
    """Local ports of process ``pid``'s TCP sockets."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed since listed
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as lines:
            next(lines)  # header
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def is_pubsub(client: dict[str, Any]) -> bool:
    counts = (int(client.get(flag) or 0) for flag in ("sub", "psub", "ssub"))
    return any(n > 0 for n in counts) or client.get("cmd", "") in PUBSUB_COMMANDS


class Census:
    """Samples of one process's connections on ``urls``: ``take()`` once, or ``sampling()`` in
    a thread every ``interval`` seconds; the peaks and the last sample are kept."""

    def __init__(self, pid: int, urls: Sequence[str], interval: float = 0.05) -> None:
        self.pid = pid
        self.admins = [redis.Redis.from_url(url, socket_timeout=5) for url in urls]
        self.interval = interval
        self.fds_before = open_fds(pid)
        self.peak = {"lock": 0, "pubsub": 0, "fds": 0}
        self.last = dict(self.peak)

    def take(self) -> dict[str, int]:
        """One sample: the most lock-path and pub/sub connections on any master, and the fds."""
        lists = [admin.client_list() for admin in self.admins]
        mine = tcp_ports(self.pid)
        lock = pubsub = 0
        for clients in lists:
            theirs = [c for c in clients if int(c["addr"].rsplit(":", 1)[1]) in mine]
            subscribed = sum(map(is_pubsub, theirs))
            lock = max(lock, len(theirs) - subscribed)
            pubsub = max(pubsub, subscribed)
        self.last = {"lock": lock, "pubsub": pubsub, "fds": open_fds(self.pid)}
        self.peak = {k: max(v, self.last[k]) for k, v in self.peak.items()}
        return self.last

    @contextlib.contextmanager
    def sampling(self) -> Iterator[Census]:
        """Sample in a thread while the block runs, then once more (the ``after`` figures)."""
        self.peak = {"lock": 0, "pubsub": 0, "fds": 0}
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(self.interval):
                with contextlib.suppress(Exception):  # a failed sample is only a missed one
                    self.take()

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.take()

    def figures(self) -> dict[str, int]:
        return {
            "conns_peak": self.peak["lock"],
            "conns_after": self.last["lock"],
            "pubsub_peak": self.peak["pubsub"],
            "fds_before": self.fds_before,
            "fds_peak": self.peak["fds"],
            "fds_after": self.last["fds"],
        }

    def close(self) -> None:
        for admin in self.admins:
            admin.close()
