"""A member that is a Sentinel-managed primary: ``redis+sentinel://s1:26379,s2:26379/mymaster/0``
(``rediss+sentinel://`` for TLS to the primary; a user and password in the URL are the
primary's, as in a plain URL; query options too).

How it follows failovers: its connections are of a class of ours (``sentinel_connection``) that
asks the Sentinels where the primary is (``SENTINEL get-master-addr-by-name``, the first that
answers) each time it opens a socket. Every way a failover shows ends in a new connection: the
old primary's connections are closed (Sentinel kills its clients when it reconfigures it; a
connection loss), or it answers ``READONLY`` (the round closes that pipe), or a Sentinel
announces ``+switch-master`` (``follow_switches``: we close our connections to the old primary at
once). So the member stays one pipelined connection per process, as any other: a round asks no
Sentinel, but one that must open that connection waits for them, all asked at once and within
the member's one budget, finding the primary and reaching it (``primary_address``). A zone that
does not answer (Sentinels and primary cut off) is a silent member, set aside for a while as any
silent master (``rounds.SKIP_SILENT_FOR``): it costs a round one budget now and then, not every
round one budget per Sentinel.
The Sentinels themselves are asked over plain TCP without a password (Sentinel's default).
"""

from __future__ import annotations

import os
import queue
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
    """Where ``service``'s primary is now, as the first Sentinel that answers says. Every
    Sentinel is asked at once, each on a short-lived thread of its own (``_ask``), and this
    waits ``timeout`` for them all, not ``timeout`` for each in turn: a Sentinel that does not
    answer costs the member one budget however many are listed. ``redis.TimeoutError`` if none
    named it within ``timeout`` and one of them stayed silent (the member is then silent, and
    set aside as any silent master), else ``redis.ConnectionError`` (all refused, or did not
    know the service)."""
    deadline = time.monotonic() + timeout
    answers: queue.SimpleQueue[_Answer] = queue.SimpleQueue()
    for host, port in service.sentinels:
        threading.Thread(
            target=_ask,
            args=(service, host, port, timeout, answers),
            name=f"redlock-sentinel-ask {host}:{port}",
            daemon=True,
        ).start()
    problems: list[str] = []
    silent = False
    while len(problems) < len(service.sentinels):
        try:
            answer = answers.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            silent = True
            break
        if isinstance(answer, tuple):
            return answer
        silent = silent or isinstance(answer, _Silent)
        problems.append(str(answer))
    unanswered = len(service.sentinels) - len(problems)
    told = "; ".join(problems + ([f"{unanswered} did not answer"] if unanswered else []))
    error = redis.TimeoutError if silent else redis.ConnectionError
    raise error(f"no Sentinel named the primary of {service.name!r} within {timeout} s: {told}")


class _Silent(str):
    """A Sentinel's problem that is silence (no answer within the budget), not a refusal."""


_Answer = tuple[str, int] | str


def _ask(
    service: Service, host: str, port: int, timeout: float, answers: queue.SimpleQueue[_Answer]
) -> None:
    """Ask one Sentinel where ``service``'s primary is; put the address, or what went wrong,
    in ``answers``."""
    conn = redis.Connection(
        host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout,
        retry=redis.retry.Retry(redis.backoff.NoBackoff(), 0), protocol=2,
    )  # fmt: skip
    try:
        conn.send_command("SENTINEL", "get-master-addr-by-name", service.name)
        reply = conn.read_response()
    except (redis.RedisError, OSError) as exc:
        kind = _Silent if isinstance(exc, redis.TimeoutError | TimeoutError) else str
        answers.put(kind(f"{host}:{port}: {type(exc).__name__}: {exc}"))
        return
    finally:
        conn.disconnect()
    if isinstance(reply, list) and len(reply) == 2:
        address, found_port = (x.decode() if isinstance(x, bytes) else str(x) for x in reply)
        answers.put((address, int(found_port)))
    else:
        answers.put(f"{host}:{port}: does not know {service.name!r}")


#: The least time left to reach the primary once a Sentinel named it (a budget the asking used
#: up to the last millisecond still tries the primary, briefly).
MIN_CONNECT = 0.001


def sentinel_connection(
    base: type[redis.connection.AbstractConnection], service: Service
) -> type[redis.connection.AbstractConnection]:
    """A connection class like ``base`` (TCP or TLS) that finds ``service``'s primary through
    Sentinel each time it opens a socket."""

    def _connect(self: Any) -> socket.socket:
        # One budget for the whole connect: finding the primary, then reaching it.
        timeout = self.socket_connect_timeout or self.socket_timeout or 1.0
        began = time.monotonic()
        self.host, self.port = primary_address(service, timeout)
        self.socket_connect_timeout = max(timeout - (time.monotonic() - began), MIN_CONNECT)
        try:
            return base._connect(self)  # type: ignore[no-any-return]
        finally:
            self.socket_connect_timeout = timeout

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
