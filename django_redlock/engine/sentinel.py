"""A member that is a Sentinel-managed primary: ``redis+sentinel://s1:26379,s2:26379/mymaster/0``
(``rediss+sentinel://`` for TLS to the primary; a user and password in the URL are the
primary's, as in a plain URL; query options too).

How it follows failovers: its connections are of a class of ours (``sentinel_connection``) that
asks the Sentinels where the primary is (``SENTINEL get-master-addr-by-name``, the first that
answers) each time it opens a socket. Every way a failover shows ends in a new connection: the
old primary's connections are closed (Sentinel kills its clients when it reconfigures it; a
connection loss), or it answers ``READONLY`` (the round closes that pipe), or a Sentinel
announces ``+switch-master`` (``follow_switches``: we close our connections to the old primary at
once). So the member stays one pipelined connection per process, as any other, and never asks a
Sentinel on a round's path.
The Sentinels themselves are asked over plain TCP without a password (Sentinel's default).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis

SCHEMES = {"redis+sentinel": "redis", "rediss+sentinel": "rediss"}
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class Service:
    """A primary as Sentinel names it, and the Sentinels that know where it is."""

    name: str
    sentinels: tuple[tuple[str, int], ...]


def is_sentinel_url(url: str) -> bool:
    return url.partition("://")[0].lower() in SCHEMES


def parse(url: str, masked: str) -> tuple[Service, str]:
    """The service a Sentinel URL names, and the plain URL (host left to Sentinel) whose options
    (user, password, db, query) the primary's connections use; ``ValueError`` naming ``masked``
    (the URL without its password) if it is not one."""
    scheme, _, rest = url.partition("://")
    netloc, _, path = rest.partition("/")
    path, query_sep, query = path.partition("?")
    userinfo, at, hosts = netloc.rpartition("@")
    sentinels = []
    for entry in hosts.split(","):
        host, port = _host_port(entry.strip(), masked)
        sentinels.append((host, port))
    name, _, db = path.partition("/")
    if not name:
        raise ValueError(
            f"node {masked!r} names no Sentinel service: "
            f"use redis+sentinel://host:26379[,host:26379...]/<service>[/<db>]"
        )
    if db and not db.isdigit():
        raise ValueError(f"node {masked!r} has a db that is not a number: {db!r}")
    plain = f"{SCHEMES[scheme.lower()]}://{userinfo}{at}sentinel-primary/{db or 0}"
    return Service(name, tuple(sentinels)), plain + query_sep + query


def _host_port(entry: str, masked: str) -> tuple[str, int]:
    if not entry:
        raise ValueError(f"node {masked!r} lists an empty Sentinel address")
    try:
        parts = urlsplit(f"//{entry}")
        port = parts.port or DEFAULT_SENTINEL_PORT
    except ValueError as exc:
        raise ValueError(f"node {masked!r} has a bad Sentinel address {entry!r}: {exc}") from None
    if not parts.hostname:
        raise ValueError(f"node {masked!r} has a Sentinel address without a host: {entry!r}")
    return parts.hostname, port


def primary_address(service: Service, timeout: float) -> tuple[str, int]:
    """Where ``service``'s primary is now, as the first Sentinel that answers says (each asked
    within ``timeout``); ``redis.ConnectionError`` if none can tell."""
    problems = []
    for host, port in service.sentinels:
        conn = redis.Connection(
            host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0), protocol=2,
        )  # fmt: skip
        try:
            conn.send_command("SENTINEL", "get-master-addr-by-name", service.name)
            reply = conn.read_response()
        except (redis.RedisError, OSError) as exc:
            problems.append(f"{host}:{port}: {type(exc).__name__}: {exc}")
            continue
        finally:
            conn.disconnect()
        if isinstance(reply, list) and len(reply) == 2:
            address, found_port = (x.decode() if isinstance(x, bytes) else str(x) for x in reply)
            return address, int(found_port)
        problems.append(f"{host}:{port}: does not know {service.name!r}")
    raise redis.ConnectionError(
        f"no Sentinel named the primary of {service.name!r}: {'; '.join(problems)}"
    )


def sentinel_connection(
    base: type[redis.connection.AbstractConnection], service: Service
) -> type[redis.connection.AbstractConnection]:
    """A connection class like ``base`` (TCP or TLS) that finds ``service``'s primary through
    Sentinel each time it opens a socket."""

    def _connect(self: Any) -> socket.socket:
        timeout = self.socket_connect_timeout or self.socket_timeout or 1.0
        self.host, self.port = primary_address(service, timeout)
        return base._connect(self)  # type: ignore[no-any-return]

    return type(f"Sentinel{base.__name__}", (base,), {"_connect": _connect, "service": service})


# --- +switch-master: follow a failover at once ------------------------------------------------

#: Seconds between attempts to (re)subscribe when no Sentinel answers.
RESUBSCRIBE_AFTER = 1.0


class SwitchWatch:
    """A daemon thread that listens for ``+switch-master`` on the Sentinels (the first that
    answers, then the next when it goes away) and tells every node of this service in this
    process that its primary moved, so they drop their connections to the old one at once,
    rather than when Sentinel demotes it (seconds later: until then the old primary still
    takes writes from whoever is connected to it)."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.listeners: weakref.WeakSet[Any] = weakref.WeakSet()
        self.pid = os.getpid()
        self._thread = threading.Thread(
            target=self._run, name=f"redlock-sentinel-{service.name}", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        while True:
            for host, port in self.service.sentinels:
                self._listen(host, port)
            time.sleep(RESUBSCRIBE_AFTER)

    def _listen(self, host: str, port: int) -> None:
        client = redis.Redis(
            host=host, port=port, socket_connect_timeout=RESUBSCRIBE_AFTER,
            socket_keepalive=True, retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0),
        )  # fmt: skip
        try:
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            pubsub.subscribe("+switch-master")
            for message in pubsub.listen():
                data = message.get("data")
                text = data.decode() if isinstance(data, bytes) else str(data)
                if text.split(" ", 1)[0] == self.service.name:
                    for node in list(self.listeners):
                        node.primary_moved()
        except (redis.RedisError, OSError):
            return  # the next Sentinel
        finally:
            client.close()


_WATCHES: dict[Service, SwitchWatch] = {}
_watches_guard = threading.Lock()


def follow_switches(service: Service, node: Any) -> None:
    """Have ``node.primary_moved()`` called on each ``+switch-master`` of ``service`` (one
    listening thread per service and process, started on first use; a forked child starts its
    own)."""
    with _watches_guard:
        watch = _WATCHES.get(service)
        if watch is None or watch.pid != os.getpid():
            watch = _WATCHES[service] = SwitchWatch(service)
        watch.listeners.add(node)
