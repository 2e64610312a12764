"""``cache:<alias>`` NODES entries over real masters, for both Redis cache backends: Django's own
``RedisCache`` (no extra package) and django-redis. A cache's connection settings are reused
(password, OPTIONS), its password is never shown, and a replicated cache (several LOCATIONs) is
refused before any connection."""

from __future__ import annotations

import pytest
from django.core.cache.backends.redis import RedisCache
from django.core.checks import run_checks

import django_redlock
from django_redlock import conf
from django_redlock.testing.masters import local_masters

DJANGO_CACHE = "django.core.cache.backends.redis.RedisCache"
DJANGO_REDIS = "django_redis.cache.RedisCache"
LOCMEM = "django.core.cache.backends.locmem.LocMemCache"


class ProjectRedisCache(RedisCache):
    """A project's own subclass of Django's backend, as some projects write."""


def errors() -> list[str]:
    return [
        m.msg for m in run_checks() if (m.id or "").startswith("django_redlock.") and m.is_serious()
    ]


def caches_for(ports: list[int], backend: str, **extra: object) -> dict[str, dict[str, object]]:
    caches: dict[str, dict[str, object]] = {"default": {"BACKEND": LOCMEM}}
    for i, port in enumerate(ports):
        caches[f"lock{i}"] = {
            "BACKEND": backend,
            "LOCATION": f"redis://127.0.0.1:{port}/0",
            **extra,
        }
    return caches


@pytest.mark.parametrize("backend", [DJANGO_CACHE, DJANGO_REDIS, f"{__name__}.ProjectRedisCache"])
def test_a_lock_over_redis_caches_holds_on_their_masters(settings, masters, backend):
    settings.CACHES = caches_for([m.port for m in masters[:3]], backend)
    settings.REDLOCK = {"NODES": ["cache:lock0", "cache:lock1", "cache:lock2"]}
    assert errors() == []
    with django_redlock.redlock("cached-job", ttl=5) as lock:
        assert lock.held
        assert [m.call("EXISTS", "redlock:lock:cached-job") for m in masters[:3]] == [1, 1, 1]
    assert [m.call("EXISTS", "redlock:lock:cached-job") for m in masters[:3]] == [0, 0, 0]


def test_djangos_cache_options_authenticate_and_the_password_is_never_shown(settings, tmp_path):
    """Django's RedisCache passes OPTIONS to its pool: the password given there (not in the URL)
    is the lock's too, and shows nowhere."""
    with local_masters(3, tmp_path) as secured:
        for master in secured:
            master.call("CONFIG", "SET", "requirepass", "s3cret-opt")
        ports = [m.port for m in secured]
        settings.CACHES = caches_for(ports, DJANGO_CACHE, OPTIONS={"password": "s3cret-opt"})
        settings.REDLOCK = {"NODES": ["cache:lock0", "cache:lock1", "cache:lock2"]}
        assert errors() == []
        with django_redlock.redlock("secured", ttl=5) as lock:
            assert lock.held
        labels = [node.label for node in conf.get_redlock().nodes]
        assert labels == [f"cache:lock{i} (redis://127.0.0.1:{p}/0)" for i, p in enumerate(ports)]
        # Without the password, the same masters refuse: the option was what authenticated.
        settings.CACHES = caches_for(ports, DJANGO_CACHE)
        with pytest.raises(django_redlock.QuorumUnavailable) as refused:
            django_redlock.redlock("secured", ttl=5).acquire()
        assert "s3cret-opt" not in str(refused.value)


def test_a_password_in_a_djangos_cache_location_is_masked(settings, masters):
    settings.CACHES = {
        "lock0": {
            "BACKEND": DJANGO_CACHE,
            "LOCATION": f"redis://:hunter2@127.0.0.1:{masters[0].port}/0",
        }
    }
    settings.REDLOCK = {"NODES": ["cache:lock0"]}
    (node,) = conf.get_redlock().nodes
    assert node.label == f"cache:lock0 (redis://:***@127.0.0.1:{masters[0].port}/0)"


@pytest.mark.parametrize("backend", [DJANGO_CACHE, DJANGO_REDIS])
@pytest.mark.parametrize(
    "location",
    [
        ["redis://127.0.0.1:7001/0", "redis://127.0.0.1:7002/0"],
        "redis://127.0.0.1:7001/0;redis://:pw-in-replica@127.0.0.1:7002/0",
        "redis://127.0.0.1:7001/0,redis://127.0.0.1:7002/0",
    ],
    ids=["list", "semicolons", "commas"],
)
def test_a_replicated_cache_is_refused(settings, backend, location):
    settings.CACHES = {"replicated": {"BACKEND": backend, "LOCATION": location}}
    settings.REDLOCK = {"NODES": ["cache:replicated"]}
    (message,) = errors()
    assert "'cache:replicated' has 2 LOCATIONs" in message
    assert "not independent masters" in message
    assert "pw-in-replica" not in message
    with pytest.raises(Exception, match="2 LOCATIONs"):
        conf.get_redlock()


def test_a_cache_of_another_backend_names_both_supported_ones(settings):
    settings.CACHES = {"default": {"BACKEND": LOCMEM}}
    settings.REDLOCK = {"NODES": ["cache:default"]}
    (message,) = errors()
    assert LOCMEM in message
    assert DJANGO_CACHE in message
    assert DJANGO_REDIS in message
