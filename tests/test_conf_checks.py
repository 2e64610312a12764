"""The REDLOCK setting: system checks by exact equality of what ``run_checks()`` reports under our
ids, ``cache:<alias>`` nodes over real masters, the cached config reset on setting changes, and
the user's dict left untouched."""

from __future__ import annotations

import copy

import pytest
from django.core.checks import Error, Warning, run_checks
from django.test import override_settings

import django_redlock
from django_redlock import conf
from django_redlock.checks import check_settings

E001_HINT = (
    'set REDLOCK = {"NODES": ["redis://host-a:6379/0", "redis://host-b:6379/0", '
    '"redis://host-c:6379/0"]} (independent masters, not replicas of each other); '
    'entries may also be "cache:<alias>" naming a Redis cache '
    "(Django's RedisCache or django-redis)"
)
E004_HINT = (
    "a master listed twice (by any spelling, db number or cache alias) votes twice, so a "
    "'quorum' could be one real master"
)
E006_HINT = "use a NODE_TIMEOUT of a few milliseconds to a few tens (0.05 by default)"
ONE_MASTER = Warning(
    "REDLOCK['NODES'] has one master: no fault tolerance (fine for development)",
    hint="a lock held on one master is lost with it; use 3 or 5 independent masters in production",
    id="django_redlock.W002",
)
LOCMEM = "django.core.cache.backends.locmem.LocMemCache"
DJANGO_REDIS = "django_redis.cache.RedisCache"
DJANGO_CACHE = "django.core.cache.backends.redis.RedisCache"


def ours():
    """What Django's check framework reports under our ids; the same list as our check alone."""
    reported = [m for m in run_checks(tags=None) if (m.id or "").startswith("django_redlock.")]
    assert reported == check_settings()
    return reported


def error(message, code, hint=None):
    return Error(message, hint=hint, id=f"django_redlock.{code}")


@pytest.fixture
def urls(masters):
    return [m.url for m in masters]


def test_valid_setting_has_no_messages(settings, urls):
    settings.REDLOCK = {
        "NODES": urls,
        "KEY_PREFIX": "locks:",
        "TTL": 10,
        "WAIT": 0,
        "NODE_TIMEOUT": 0.02,
        "CLOCK_DRIFT_FACTOR": 0.01,
        "RETRY_DELAY": 0.05,
    }
    assert ours() == []
    settings.REDLOCK = {"NODES": urls[:3]}
    assert ours() == []
    settings.REDLOCK = {"NODES": urls[:1]}
    assert ours() == [ONE_MASTER]


def test_one_master_is_development_said_once(settings, urls):
    """One master works, but nothing survives its loss: a warning, not silence (redlock_status
    says OK (single master, no fault tolerance) to match)."""
    settings.REDLOCK = {"NODES": urls[:1]}
    assert ours() == [ONE_MASTER]


def test_no_nodes(settings):
    settings.REDLOCK = {"NODES": []}
    expected = [
        error("REDLOCK['NODES'] is empty: there are no Redis masters to lock on", "E001", E001_HINT)
    ]
    assert ours() == expected
    del settings.REDLOCK  # no setting at all: an error, never a silent localhost
    assert ours() == [error("settings.REDLOCK is not defined", "E001", E001_HINT)]


def test_a_misspelled_setting_name_is_named(settings, urls):
    """Was: "NODES is empty", for a setting that was there under another name."""
    del settings.REDLOCK
    settings.REDLOK = {"NODES": urls[:3]}
    assert ours() == [
        error(
            "settings.REDLOCK is not defined (there is a setting named 'REDLOK': a misspelling?)",
            "E001",
            E001_HINT,
        )
    ]


def test_setting_not_a_dict(settings, urls):
    settings.REDLOCK = urls[:3]
    assert ours() == [error(f"REDLOCK must be a dict, got list {urls[:3]!r}", "E002")]


def test_unknown_key(settings, urls):
    settings.REDLOCK = {"NODES": urls[:3], "TIMEOUT": 1, "NODE": "x"}
    assert ours() == [
        error(
            "REDLOCK has unknown keys: 'NODE', 'TIMEOUT'",
            "E002",
            hint="known keys: NODES, KEY_PREFIX, TTL, WAIT, NODE_TIMEOUT, CLOCK_DRIFT_FACTOR, "
            "RETRY_DELAY, MAX_TTL, QUARANTINE",
        )
    ]


def test_nodes_not_a_list(settings, urls):
    settings.REDLOCK = {"NODES": urls[0]}
    assert ours() == [error(f"REDLOCK['NODES'] must be a list, got {urls[0]!r}", "E003")]


def test_bad_url(settings, urls):
    settings.REDLOCK = {"NODES": [urls[0], "http://127.0.0.1:1/0", urls[1]]}
    assert ours() == [
        error(
            "REDLOCK['NODES'] entry: node 'http://127.0.0.1:1/0' is not a redis://, rediss://, "
            "unix://, redis+sentinel:// or redis+cluster:// URL",
            "E003",
        )
    ]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("redis+sentinel://127.0.0.1:26379/", "names no Sentinel service"),
        ("redis+cluster://127.0.0.1:7000/9", "a Redis Cluster has only db 0"),
        ("rediss+sentinel+redis://127.0.0.1:7000/m", "is not a redis://"),
    ],
)
def test_bad_sentinel_or_unknown_scheme_is_an_error_naming_the_entry(
    settings, urls, entry, message
):
    settings.REDLOCK = {"NODES": [urls[0], entry, urls[1]]}
    (problem,) = ours()
    assert problem.id == "django_redlock.E003"
    assert f"node {entry!r}" in problem.msg
    assert message in problem.msg


def test_sentinel_members_without_quarantine_are_warned_about(settings, urls):
    sentinel = "redis+sentinel://:secret@127.0.0.1:26379/mymaster/0"
    settings.REDLOCK = {"NODES": [sentinel, urls[0], urls[1]]}
    (warning,) = ours()
    assert warning.id == "django_redlock.W003"
    assert "redis+sentinel://:***@127.0.0.1:26379/mymaster/0" in warning.msg
    assert "secret" not in warning.msg
    settings.REDLOCK = {"NODES": [sentinel, *urls[:2]], "QUARANTINE": True, "MAX_TTL": 30}
    assert ours() == []


def test_cluster_members_without_quarantine_are_warned_about(settings, urls):
    """A Cluster's shards fail over to their replicas by themselves, as Sentinel's primary does."""
    cluster = "redis+cluster://:secret@127.0.0.1:7000,127.0.0.1:7001/"
    settings.REDLOCK = {"NODES": [cluster, urls[0], urls[1]]}
    (warning,) = ours()
    assert warning.id == "django_redlock.W003"
    assert "Cluster members (redis+cluster://:***@127.0.0.1:7000,127.0.0.1:7001/)" in warning.msg
    assert "secret" not in warning.msg
    settings.REDLOCK = {"NODES": [cluster, *urls[:2]], "QUARANTINE": True, "MAX_TTL": 30}
    assert ours() == []


def test_two_entries_for_one_sentinel_service_are_the_duplicate_error(settings, urls):
    one = "redis+sentinel://127.0.0.1:26379,localhost:26380/mymaster/0"
    other = "redis+sentinel://localhost:26380,127.0.0.1:26379/mymaster/3"
    settings.REDLOCK = {"NODES": [one, other, urls[0]], "QUARANTINE": True, "MAX_TTL": 30}
    assert [p.id for p in ours()] == ["django_redlock.E004"]
    assert f"{other} (the same redis-server as {one})" in ours()[0].msg


def test_bad_url_password_is_masked(settings, urls):
    settings.REDLOCK = {"NODES": [urls[0], "http://user:hunter2@127.0.0.1:1/0", urls[1]]}
    (message,) = ours()
    assert message.id == "django_redlock.E003"
    assert "hunter2" not in message.msg
    assert "user:***@127.0.0.1:1" in message.msg


def test_unknown_cache_alias(settings, urls):
    settings.REDLOCK = {"NODES": [urls[0], "cache:nosuch", urls[1]]}
    assert ours() == [
        error(
            "REDLOCK['NODES'] entry: 'cache:nosuch' names no cache in CACHES (known: default)",
            "E003",
        )
    ]


def test_cache_that_is_not_django_redis(settings, urls):
    settings.CACHES = {"default": {"BACKEND": LOCMEM}}
    settings.REDLOCK = {"NODES": [urls[0], "cache:default", urls[1]]}
    assert ours() == [
        error(
            f"REDLOCK['NODES'] entry: 'cache:default' is a {LOCMEM!r} cache; lock masters can "
            f"be Django's {DJANGO_CACHE!r} or django-redis' {DJANGO_REDIS!r} caches",
            "E003",
        )
    ]


def test_duplicate_node(settings, urls):
    settings.REDLOCK = {"NODES": [urls[0], urls[1], urls[0]]}
    assert ours() == [
        error(
            f"REDLOCK['NODES'] lists the same master more than once: {urls[0]}", "E004", E004_HINT
        )
    ]


@pytest.mark.parametrize(
    "spelling",
    [
        "redis://localhost:{port}/0",
        "redis://127.1:{port}/0",
        "redis://127.0.0.2:{port}/3",
        "redis://[::1]:{port}/0",
        "redis://[::ffff:127.0.0.1]:{port}/0",
        "redis://LOCALHOST.:{port}",
    ],
)
def test_one_loopback_master_under_another_spelling_is_a_duplicate(settings, urls, spelling):
    """Was a bug: localhost, 127.0.0.1 and 127.1 passed the check, so a "quorum" of two could be
    one redis-server. The hint promises "by any spelling": loopback is normalized without DNS."""
    port = urls[0].rsplit(":", 1)[1].split("/")[0]
    other = spelling.format(port=port)
    settings.REDLOCK = {"NODES": [urls[0], urls[1], other]}
    [problem] = ours()
    assert problem.id == "django_redlock.E004"
    assert f"{other} (the same redis-server as {urls[0]})" in problem.msg


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("TTL", "30", "REDLOCK['TTL'] must be a number of seconds, got '30'"),
        ("TTL", float("inf"), "REDLOCK['TTL'] must be finite, got inf"),
        ("WAIT", -1, "REDLOCK['WAIT'] must be >= 0 seconds, got -1"),
        ("WAIT", True, "REDLOCK['WAIT'] must be a number of seconds, got True"),
        ("NODE_TIMEOUT", float("nan"), "REDLOCK['NODE_TIMEOUT'] must be finite, got nan"),
        ("NODE_TIMEOUT", 0, "REDLOCK['NODE_TIMEOUT'] must be > 0 seconds, got 0"),
        ("CLOCK_DRIFT_FACTOR", 1.5, "REDLOCK['CLOCK_DRIFT_FACTOR'] must be below 1, got 1.5"),
        (
            "CLOCK_DRIFT_FACTOR",
            -0.1,
            "REDLOCK['CLOCK_DRIFT_FACTOR'] must be >= 0 seconds, got -0.1",
        ),
        ("RETRY_DELAY", 0, "REDLOCK['RETRY_DELAY'] must be > 0 seconds, got 0"),
        ("KEY_PREFIX", 3, "REDLOCK['KEY_PREFIX'] must be a str, got 3"),
    ],
)
def test_bad_number(settings, urls, key, value, message):
    settings.REDLOCK = {"NODES": urls[:3], key: value}
    assert ours() == [error(message, "E005")]


def test_ttl_too_short_is_also_a_node_timeout_problem(settings, urls):
    settings.REDLOCK = {"NODES": urls[:3], "TTL": 0.005}
    assert ours() == [
        error("REDLOCK['TTL'] must be at least 0.01 seconds, got 0.005", "E005"),
        error(
            "REDLOCK['NODE_TIMEOUT'] (0.05s) is not small next to REDLOCK['TTL'] (0.005s): one "
            "slow master would eat the whole lease",
            "E006",
            E006_HINT,
        ),
    ]


@pytest.mark.parametrize("ttl", [0, -1])
def test_non_positive_ttl_is_one_error(settings, urls, ttl):
    """Was reported twice (not > 0, and below 0.01)."""
    settings.REDLOCK = {"NODES": urls[:3], "TTL": ttl}
    assert ours() == [error(f"REDLOCK['TTL'] must be > 0 seconds, got {ttl}", "E005")]


def test_node_timeout_not_small_next_to_ttl(settings, urls):
    settings.REDLOCK = {"NODES": urls[:3], "TTL": 1, "NODE_TIMEOUT": 0.5}
    assert ours() == [
        error(
            "REDLOCK['NODE_TIMEOUT'] (0.5s) is not small next to REDLOCK['TTL'] (1s): one slow "
            "master would eat the whole lease",
            "E006",
            E006_HINT,
        )
    ]
    settings.REDLOCK = {"NODES": urls[:3], "TTL": 1, "NODE_TIMEOUT": 0.49}
    assert ours() == []


def test_even_number_of_nodes(settings, urls):
    settings.REDLOCK = {"NODES": urls[:4]}
    assert ours() == [
        Warning(
            "REDLOCK['NODES'] has an even number of masters (4): it tolerates no more failures "
            "than 3 would",
            hint="use an odd number of masters (3 or 5)",
            id="django_redlock.W001",
        )
    ]


def test_several_problems_are_all_reported(settings, urls):
    settings.REDLOCK = {"NODES": [urls[0], urls[0]], "WAIT": -1, "EXTRA": 1}
    assert [m.id for m in ours()] == [
        "django_redlock.E002",
        "django_redlock.E004",
        "django_redlock.W001",
        "django_redlock.E005",
    ]


# --- cache:<alias> nodes -------------------------------------------------------------------------


def redis_caches(masters, password=""):
    auth = f":{password}@" if password else ""
    caches = {"default": {"BACKEND": LOCMEM}}
    for i, m in enumerate(masters):
        caches[f"lock{i}"] = {
            "BACKEND": DJANGO_REDIS,
            "LOCATION": f"redis://{auth}127.0.0.1:{m.port}/0",
        }
    return caches


def test_cache_alias_nodes_lock_on_the_caches_masters(settings, masters):
    settings.CACHES = redis_caches(masters)
    settings.REDLOCK = {"NODES": [f"cache:lock{i}" for i in range(5)], "NODE_TIMEOUT": 0.25}
    assert ours() == []
    with django_redlock.redlock("job", ttl=5) as lock:
        assert lock.held
        values = [m.client().get("redlock:lock:job") for m in masters]
        assert None not in values
    assert [m.client().get("redlock:lock:job") for m in masters] == [None] * 5


def test_cache_alias_nodes_are_labelled_without_password(settings, masters):
    settings.CACHES = redis_caches(masters[:3], password="s3cret")
    settings.REDLOCK = {"NODES": [f"cache:lock{i}" for i in range(3)]}
    assert ours() == []
    labels = [node.label for node in conf.get_redlock().nodes]  # built without connecting
    assert labels == [
        f"cache:lock{i} (redis://:***@127.0.0.1:{m.port}/0)" for i, m in enumerate(masters[:3])
    ]


def test_a_master_named_by_url_and_by_cache_alias_is_a_duplicate(settings, masters):
    """Was a bug: duplicates were found by label text, so this master voted twice."""
    settings.CACHES = redis_caches(masters[:1])
    settings.REDLOCK = {"NODES": ["cache:lock0", masters[0].url, masters[1].url]}
    label = f"cache:lock0 (redis://127.0.0.1:{masters[0].port}/0)"
    assert ours() == [
        error(
            f"REDLOCK['NODES'] lists the same master more than once: {masters[0].url} (the same "
            f"redis-server as {label})",
            "E004",
            E004_HINT,
        )
    ]


# --- the cached config ---------------------------------------------------------------------------


def test_config_is_cached_and_reset_on_setting_change(settings, urls):
    settings.REDLOCK = {"NODES": urls, "TTL": 5}
    assert conf.get_config() is conf.get_config()
    assert conf.get_config().ttl == 5.0
    engine = conf.get_redlock()
    assert engine is conf.get_redlock()
    with override_settings(REDLOCK={"NODES": urls[:3], "TTL": 7, "KEY_PREFIX": "other:"}):
        assert conf.get_config().ttl == 7.0
        assert conf.get_config().nodes == tuple(urls[:3])
        assert conf.get_redlock() is not engine
        lock = django_redlock.redlock("job")
        assert lock.ttl == 7.0
        assert lock.key == "other:lock:job"
    assert conf.get_config().ttl == 5.0
    assert conf.get_redlock().ttl == 5.0
    assert django_redlock.redlock("job").key == "redlock:lock:job"


def test_caches_change_also_resets_the_engine(settings, masters):
    settings.CACHES = redis_caches(masters[:3])
    settings.REDLOCK = {"NODES": ["cache:lock0", "cache:lock1", "cache:lock2"]}
    first = [n.label for n in conf.get_redlock().nodes]
    settings.CACHES = redis_caches(masters[2:])
    second = [n.label for n in conf.get_redlock().nodes]
    assert first != second
    assert str(masters[2].port) in second[0]


def test_the_users_setting_is_never_mutated(settings, urls):
    user = {"NODES": list(urls), "TTL": 5, "WAIT": 0.5, "NODE_TIMEOUT": 0.25}
    before = copy.deepcopy(user)
    settings.REDLOCK = user
    assert ours() == []
    conf.get_config()
    conf.get_redlock()
    with django_redlock.redlock("job") as lock:
        assert lock.held
    assert settings.REDLOCK is user
    assert user == before
    assert set(user) == {"NODES", "TTL", "WAIT", "NODE_TIMEOUT"}  # no defaults merged in
