"""A member's URL: which schemes we take, checked before any connection (``ValueError`` naming the
URL, its password masked), masked for logs and status output, and which server or Sentinel
service it names (two entries naming one must not vote twice)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis

from . import acks, cluster, protocol, sentinel

SUPPORTED_SCHEMES = ("redis", "rediss", "unix", *sentinel.SCHEMES, *cluster.SCHEMES)
SCHEMES_TEXT = "a redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL"


def mask_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs, errors, status output)."""
    # Several hosts: urlsplit cannot parse its port.
    if sentinel.is_sentinel_url(url) or cluster.is_cluster_url(url):
        scheme, _, rest = url.partition("://")
        netloc, slash, path = rest.partition("/")
        userinfo, at, hosts = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        return f"{scheme}://{user}{':***' if colon else ''}{at}{hosts}{slash}{path}"
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


def check_url(url: object) -> str:
    """``url`` if it is a Redis URL we can use, else ``ValueError`` naming it (masked)."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"a node must be {SCHEMES_TEXT}, got {url!r}")
    checked = url
    url, ack = acks.parse(url, mask_url(url))  # our options (the rest is redis-py's)
    if sentinel.is_sentinel_url(url):
        sentinel.parse(url, mask_url(url))
        return checked
    if cluster.is_cluster_url(url):
        if ack is not None:  # (its shards' connections are not ours to follow with WAIT yet)
            raise ValueError(
                f"node {mask_url(url)!r}: {acks.REPLICAS_OPTION} is not supported on a "
                f"redis+cluster:// member"
            )
        cluster.parse(url, mask_url(url))
        return checked
    parts = urlsplit(url)
    if parts.scheme not in SUPPORTED_SCHEMES:
        raise ValueError(f"node {mask_url(url)!r} is not {SCHEMES_TEXT}")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError(f"node {mask_url(url)!r} has no host")
    if parts.scheme == "unix" and not parts.path:
        raise ValueError(f"node {mask_url(url)!r} has no socket path")
    try:
        parts.port  # noqa: B018 (urlsplit checks the port lazily)
        redis.connection.parse_url(url)
    except ValueError as exc:
        raise ValueError(f"node {mask_url(url)!r} is not a valid Redis URL: {exc}") from None
    return checked


def sentinel_identity(service: sentinel.Service) -> tuple[str, ...]:
    """A Sentinel service, as ``NodeSpec.identity``: its name and its Sentinels (in any order,
    loopback however spelled). Two entries naming one service through other Sentinels of the
    same group are not recognized: that would need asking them."""
    addresses = sorted(
        "/".join(protocol.server_identity({"host": host, "port": port}))
        for host, port in service.sentinels
    )
    return ("sentinel", service.name, *addresses)


def cluster_identity(seeds: cluster.Seeds) -> tuple[str, ...]:
    """A Cluster member, as ``NodeSpec.identity``: its seeds (in any order, loopback however
    spelled). Entries that share any seed are caught too (``NodeSpec.addresses``); two naming
    one cluster through disjoint seeds are not: that would need asking them."""
    identities = {protocol.server_identity({"host": h, "port": p}) for h, p in seeds.addresses}
    addresses = sorted("/".join(identity) for identity in identities)
    return ("cluster", *addresses)
