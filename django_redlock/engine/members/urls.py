"""A member's URL: which schemes we take, checked before any connection (``ValueError`` naming the
URL, its password masked), masked for logs and status output, and which server or Sentinel
service it names (two entries naming one must not vote twice)."""

from __future__ import annotations

from urllib.parse import urlsplit

import redis

from ..base import protocol
from . import acks, cluster, sentinel
from .masking import RESERVED_IN_CREDENTIALS, mask_url, scrub, split_credentials

__all__ = ["check_url", "cluster_identity", "mask_url", "sentinel_identity"]

SUPPORTED_SCHEMES = ("redis", "rediss", "unix", *sentinel.SCHEMES, *cluster.SCHEMES)
SCHEMES_TEXT = "a redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL"


def check_url(url: object) -> str:
    """``url`` if it is a Redis URL we can use, else ``ValueError`` naming it (masked: no
    password, no secret option, nor any piece of one, whether or not the URL parses)."""
    if not isinstance(url, str) or not url:
        raise ValueError(f"a node must be {SCHEMES_TEXT}, got {_shown(url)}")
    _check_credentials(url)
    try:
        return _checked(url)
    except ValueError as exc:
        raise ValueError(scrub(str(exc), url)) from None


def _check_credentials(url: str) -> None:
    """A ``/``, ``?`` or ``#`` before the URL's last ``@``: a password (or user) that was not
    percent-encoded, which every parser would cut in two (the rest read as host, path or query,
    and shown as such); or a ``@`` in a path or an option, which the masking cannot tell from
    one. Either way, one encoding fixes it."""
    _head, user, password, _rest = split_credentials(url)
    written = user + (password or "")
    # (A "#" anywhere starts a fragment, which a Redis URL has no use for: the end of a password
    # or a query option's secret value, cut off and sent as the whole.)
    if "#" in url or any(char in written for char in RESERVED_IN_CREDENTIALS):
        raise ValueError(
            f"node {mask_url(url)!r} holds an unescaped '#', or a '/' or '?' before its last "
            f"'@' (in the user or password): percent-encode them in a password or option "
            f"(%23, %2F, %3F), and a '@' anywhere after the host (%40)"
        )


def _checked(url: str) -> str:
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


def _shown(value: object) -> str:
    """A node entry that is not a ``str``, for an error: text in it is masked as a URL would
    be (bytes); a container shows its type only (it may hold URLs)."""
    if isinstance(value, bytes):
        return f"bytes {mask_url(value.decode(errors='replace'))!r}"
    if value is None or isinstance(value, int | float | bool | str):
        return repr(value)
    return f"a {type(value).__name__}"


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
