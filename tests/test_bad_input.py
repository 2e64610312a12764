"""The bad-input table of RELIABILITY.md: each bad value raises ``ValueError`` (or
``ImproperlyConfigured`` for settings) naming the value, BEFORE any network call.

"Before any network call" is proved, not assumed: the engine talks to real masters through
``DelayProxy``s that count the connections they accept, and the count must not move. A positive
control (a valid lock through the same proxies) shows the counter does move when the engine
connects.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re

import pytest
from django.core.exceptions import ImproperlyConfigured

import django_redlock
from django_redlock.checks import check_settings
from django_redlock.engine import Redlock
from django_redlock.engine.base.protocol import MAX_RESOURCE_LENGTH
from django_redlock.testing.proxy import DelayProxy

TOO_LONG = "r" * (MAX_RESOURCE_LENGTH + 1)

# (keyword arguments of lock(), text the error must contain)
BAD_LOCK_ARGUMENTS = [
    ({"ttl": 0}, "ttl must be > 0 seconds, got 0"),
    ({"ttl": 0.0}, "got 0.0"),
    ({"ttl": -1}, "ttl must be > 0 seconds, got -1"),
    ({"ttl": -0.5}, "got -0.5"),
    ({"ttl": math.nan}, "ttl must be finite, got nan"),
    ({"ttl": math.inf}, "ttl must be finite, got inf"),
    ({"ttl": -math.inf}, "got -inf"),
    ({"ttl": True}, "ttl must be a number of seconds, got True"),
    ({"ttl": False}, "got False"),
    ({"ttl": "10"}, "ttl must be a number of seconds, got '10'"),
    ({"ttl": 0.001}, "ttl must be at least 0.01 seconds, got 0.001"),
    ({"wait": -1}, "wait must be >= 0 seconds, got -1"),
    ({"wait": -0.001}, "got -0.001"),
    ({"wait": math.nan}, "wait must be finite, got nan"),
    ({"wait": "5"}, "got '5'"),
    ({"wait": True}, "got True"),
    ({"resource": ""}, "resource must not be empty"),
    ({"resource": None}, "resource must be a str, got NoneType None"),
    ({"resource": 42}, "resource must be a str, got int 42"),
    ({"resource": b"job"}, "resource must be a str, got bytes b'job'"),
    ({"resource": TOO_LONG}, f"resource is {MAX_RESOURCE_LENGTH + 1} characters long"),
    ({"ttl": 1e17}, "ttl must be at most 31536000 seconds (a year), got 1e+17"),
    ({"ttl": 1e300}, "got 1e+300"),
    ({"wait": 1e17}, "wait must be at most 31536000 seconds (a year), got 1e+17"),
    ({"resource": "a\udcffb"}, "resource has a lone surrogate at position 1"),
    ({"resource": "\ud800"}, "resource has a lone surrogate at position 0"),
    ({"label": 7}, "label must be a non-empty str, got 7"),
    ({"label": "x" * 4_000_000}, "label is 4000000 characters long, more than 200"),
    ({"label": "x" * 201}, "label is 201 characters long, more than 200"),
    ({"label": "la\udcffbel"}, "label has a lone surrogate at position 2"),
    ({"limit": 0}, "limit must be an int from 1 to 10000, got 0"),
    ({"limit": 10_001}, "limit must be an int from 1 to 10000, got 10001"),
    ({"limit": -3}, "got -3"),
    ({"limit": True}, "got True"),
    ({"limit": 2.5}, "got 2.5"),
    ({"limit": "3"}, "got '3'"),
    ({"limit": 3, "shared": True}, "limit=3 with shared=True"),
    ({"limit": 3, "reentrant": True}, "limit=3 with reentrant=True"),
    ({"shared": "yes"}, "shared must be True or False, got 'yes'"),
]

# (positional nodes / keyword arguments of Redlock(), text the error must contain)
BAD_ENGINE_ARGUMENTS = [
    ({"nodes": ["not a url"]}, "'not a url'"),
    ({"nodes": ["http://127.0.0.1:6379/0"]}, "'http://127.0.0.1:6379/0' is not a redis://"),
    ({"nodes": ["redis://:secret@/0"]}, "has no host"),
    ({"nodes": ["redis://127.0.0.1:notaport/0"]}, "is not a valid Redis URL"),
    ({"nodes": [""]}, "got ''"),
    ({"nodes": [None]}, "got None"),
    ({"nodes": []}, "non-empty list of URLs, got []"),
    ({"nodes": "redis://127.0.0.1:1/0"}, "non-empty list of URLs, got 'redis://127.0.0.1:1/0'"),
    ({"ttl": 0}, "ttl must be > 0 seconds, got 0"),
    ({"ttl": math.nan}, "got nan"),
    ({"wait": -1}, "wait must be >= 0 seconds, got -1"),
    ({"node_timeout": 0}, "node_timeout must be > 0 seconds, got 0"),
    ({"node_timeout": math.inf}, "got inf"),
    ({"node_timeout": 10.0, "ttl": 0.05}, "node_timeout (10.0s) is not small next to ttl (0.05s)"),
    ({"node_timeout": 0.05, "ttl": 0.1}, "node_timeout (0.05s) is not small next to ttl (0.1s)"),
    ({"ttl": 1e17}, "ttl must be at most 31536000 seconds (a year), got 1e+17"),
    ({"drift_factor": 1.5}, "drift_factor must be below 1, got 1.5"),
    ({"drift_factor": -0.1}, "got -0.1"),
    ({"retry_delay": 0}, "retry_delay must be > 0 seconds, got 0"),
    ({"key_prefix": 3}, "key_prefix must be a str, got 3"),
]


def case_ids(table):
    """``ttl=nan``-style test ids (cut short: a too-long resource would make a huge one)."""
    return [", ".join(f"{k}={v!r}"[:30] for k, v in arguments.items()) for arguments, _ in table]


@pytest.fixture(scope="module")
def counted(_shared_masters):
    """Three connection-counting proxies in front of three real masters."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(DelayProxy(m.port)) for m in _shared_masters[3]]


def connections(proxies):
    return sum(p.accepted for p in proxies)


@pytest.fixture
def no_connection(counted):
    """Asserts that the test opened no connection to any master."""
    before = connections(counted)
    yield counted
    assert connections(counted) == before, "a connection was made before the input was checked"


def test_the_counter_sees_connections(counted):
    """Positive control: a valid lock through the proxies does connect."""
    before = connections(counted)
    engine = Redlock([p.url for p in counted], node_timeout=0.25)
    try:
        with engine.lock("bad-input:positive-control", ttl=1) as lock:
            assert lock.held
    finally:
        engine.close()
    assert connections(counted) >= before + 3


@pytest.mark.parametrize(
    ("arguments", "message"), BAD_LOCK_ARGUMENTS, ids=case_ids(BAD_LOCK_ARGUMENTS)
)
def test_engine_lock_rejects_bad_input(no_connection, arguments, message):
    engine = Redlock([p.url for p in no_connection])
    options = {"resource": "job", "ttl": 1.0, "wait": 0.0, **arguments}
    resource = options.pop("resource")
    try:
        with pytest.raises(ValueError, match=re.escape(message)):
            engine.lock(resource, **options)
        # The same through ``with`` and ``async with``: the error comes before any I/O.
        with pytest.raises(ValueError, match=re.escape(message)), engine.lock(resource, **options):
            pytest.fail("entered a lock with bad input")

        async def enter():
            async with engine.lock(resource, **options):
                pytest.fail("entered a lock with bad input")

        with pytest.raises(ValueError, match=re.escape(message)):
            asyncio.run(enter())
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("arguments", "message"), BAD_ENGINE_ARGUMENTS, ids=case_ids(BAD_ENGINE_ARGUMENTS)
)
def test_engine_rejects_bad_settings(no_connection, arguments, message):
    options = {"nodes": [p.url for p in no_connection], **arguments}
    nodes = options.pop("nodes")
    with pytest.raises(ValueError, match=re.escape(message)):
        Redlock(nodes, **options)


def test_engine_rejects_a_master_listed_twice(no_connection):
    url = no_connection[0].url
    with pytest.raises(ValueError, match="listed more than once") as caught:
        Redlock([url, no_connection[1].url, url])
    assert url in str(caught.value)


@pytest.mark.parametrize(
    "spelling",
    [
        "redis://127.0.0.1:{port}",
        "redis://127.0.0.1:{port}/",
        "redis://127.0.0.1:{port}/1",
        "redis://localhost:{port}/0",  # the loopback spellings: the engine needs the lead's
        "redis://127.1:{port}/0",  # NodeSpec.identity -> protocol.server_identity
        "redis://[::1]:{port}/0",
    ],
)
def test_engine_rejects_one_master_spelled_two_ways(no_connection, spelling):
    """Was a bug: duplicates were found by URL text, so one redis-server named two ways (or with
    another db number: still one failure domain) voted twice."""
    first = no_connection[0]
    other = spelling.format(port=first.port)
    with pytest.raises(ValueError, match="listed more than once") as caught:
        Redlock([first.url, other, no_connection[1].url])
    assert f"{other} (the same redis-server as {first.url})" in str(caught.value)


def test_engine_masks_the_password_of_a_bad_url(no_connection):
    with pytest.raises(ValueError, match=r"user:\*\*\*@") as caught:
        Redlock(["http://user:hunter2@127.0.0.1:1/0"])
    assert "hunter2" not in str(caught.value)


@pytest.mark.parametrize(
    ("arguments", "message"), BAD_LOCK_ARGUMENTS, ids=case_ids(BAD_LOCK_ARGUMENTS)
)
def test_redlock_shortcut_rejects_bad_input(settings, no_connection, arguments, message):
    settings.REDLOCK = {"NODES": [p.url for p in no_connection]}
    options = {"resource": "job", **arguments}
    resource = options.pop("resource")
    with pytest.raises(ValueError, match=re.escape(message)):
        django_redlock.redlock(resource, **options)


@pytest.mark.parametrize(
    ("entry", "shown"),
    [
        ("not a url", "'not a url'"),
        ("http://127.0.0.1:6379/0", "'http://127.0.0.1:6379/0'"),
        ("cache:nosuch", "'cache:nosuch' names no cache"),
        (42, "got 42"),
    ],
)
def test_redlock_shortcut_rejects_a_bad_node_setting(settings, no_connection, entry, shown):
    settings.REDLOCK = {"NODES": [entry, *(p.url for p in no_connection[:2])]}
    with pytest.raises(ImproperlyConfigured, match=re.escape(shown)):
        django_redlock.redlock("job")
    # The system check says the same, at ``manage.py check`` time.
    (error,) = check_settings()
    assert error.id == "django_redlock.E003"
    assert shown in error.msg


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("TTL", 0, "REDLOCK['TTL'] must be > 0 seconds, got 0"),
        ("TTL", math.nan, "got nan"),
        ("TTL", "30", "got '30'"),
        ("WAIT", -1, "REDLOCK['WAIT'] must be >= 0 seconds, got -1"),
        ("NODE_TIMEOUT", True, "got True"),
        ("TTL", 1e17, "REDLOCK['TTL'] must be at most 31536000 seconds (a year), got 1e+17"),
        ("WAIT", 1e300, "REDLOCK['WAIT'] must be at most 31536000 seconds (a year)"),
        ("NODE_TIMEOUT", 20.0, "REDLOCK['NODE_TIMEOUT'] (20.0s) is not small next to"),
    ],
)
def test_redlock_shortcut_rejects_bad_numbers_in_settings(
    settings, no_connection, key, value, shown
):
    settings.REDLOCK = {"NODES": [p.url for p in no_connection], key: value}
    with pytest.raises(ImproperlyConfigured, match=re.escape(shown)):
        django_redlock.redlock("job")
