"""A ``NODES`` entry ``cache:<alias>``: a lock master taken from a cache of ``CACHES``.

Two backends talk to one Redis and can lend theirs: Django's own ``RedisCache`` (since Django
4.0, no extra package) and django-redis (the ``django-redis`` extra). The engine reuses the
cache's connection settings (URL, ``OPTIONS``: password, username, TLS, timeouts), never its
sockets. No I/O here: building a pool connects to nothing.

A cache with several ``LOCATION``\\s is a primary and its replicas (both backends send writes to
the first and reads to the others): they are one failure domain, not independent masters, and
a lock that counted them apart would be as safe as one Redis. Refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from .engine.members.connections import NodeSpec
from .engine.members.urls import mask_url

DJANGO_REDIS_CACHE = "django.core.cache.backends.redis.RedisCache"
DJANGO_REDIS_PACKAGE_CACHE = "django_redis.cache.RedisCache"
SUPPORTED = f"Django's {DJANGO_REDIS_CACHE!r} or django-redis' {DJANGO_REDIS_PACKAGE_CACHE!r}"


def cache_node_spec(alias: str) -> NodeSpec:
    """The master that ``cache:<alias>`` names, or ``ImproperlyConfigured`` saying why not."""
    caches: Mapping[str, Mapping[str, Any]] = getattr(settings, "CACHES", {})
    if alias not in caches:
        raise ImproperlyConfigured(
            f"'cache:{alias}' names no cache in CACHES "
            f"(known: {', '.join(sorted(caches)) or 'none'})"
        )
    config = caches[alias]
    backend = str(config.get("BACKEND", ""))
    servers = locations(config.get("LOCATION", ""))
    if len(servers) > 1:
        shown = ", ".join(mask_url(s) for s in servers)
        raise ImproperlyConfigured(
            f"'cache:{alias}' has {len(servers)} LOCATIONs ({shown}): a primary and its "
            "replicas are one failure domain, not independent masters; name each master in "
            "NODES by its own URL or cache alias"
        )
    if backend.startswith("django_redis."):
        pool = _django_redis_pool(alias)
    elif _is_djangos_redis_cache(backend):
        pool = _djangos_pool(alias)
    else:
        raise ImproperlyConfigured(
            f"'cache:{alias}' is a {backend!r} cache; lock masters can be {SUPPORTED} caches"
        )
    label = f"cache:{alias} ({mask_url(servers[0] if servers else '')})"
    return NodeSpec.from_pool(label, pool)


def locations(location: object) -> list[str]:
    """A cache's servers, as both backends read ``LOCATION``: a list, or one string of URLs
    separated by ``,`` (django-redis) or ``;`` and ``,`` (Django)."""
    if isinstance(location, list | tuple):
        return [str(s) for s in location if str(s).strip()]
    return [s.strip() for s in re.split("[;,]", str(location)) if s.strip()]


def _is_djangos_redis_cache(backend: str) -> bool:
    if backend == DJANGO_REDIS_CACHE:
        return True
    try:  # a project's subclass of Django's RedisCache lends its connections the same way
        from django.core.cache.backends.redis import RedisCache

        found = import_string(backend)
    except ImportError:
        return False
    return isinstance(found, type) and issubclass(found, RedisCache)


def _djangos_pool(alias: str) -> redis.ConnectionPool:
    from django.core.cache import caches

    # Django's RedisCacheClient builds its write pool from LOCATION and OPTIONS (pool_class,
    # parser_class, db, password, ssl...) exactly as the cache's own writes get it.
    client = caches[alias]._cache  # type: ignore[attr-defined]
    pool: redis.ConnectionPool = client._get_connection_pool(write=True)
    return pool


def _django_redis_pool(alias: str) -> redis.ConnectionPool:
    try:
        from django_redis import get_redis_connection  # builds a pool; does not connect
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"'cache:{alias}' is a django-redis cache, but django-redis is not installed "
            "(pip install 'django-redlock[django-redis]')"
        ) from exc
    pool: redis.ConnectionPool = get_redis_connection(alias, write=True).connection_pool
    return pool
