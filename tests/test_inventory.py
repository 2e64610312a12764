"""The inventory of held locks and the force release, against real masters."""

from __future__ import annotations

import hashlib
import re
import threading
import time

import pytest

from django_redlock import LockLost
from django_redlock.engine import Redlock
from django_redlock.engine.base.values import UnreadableValue, fingerprint, parse_value
from django_redlock.operations.force_release import force_release
from django_redlock.operations.inventory import glob_escape, inspect, list_locks

FOREIGN_TOKEN = "0123456789abcdef0123456789abcdef"


def raw_values(masters, key):
    """What each master stores at ``key`` (bytes or None), read directly."""
    return [m.call("GET", key) for m in masters]


def put(master, key, value, ttl_ms=20_000):
    client = master.client()
    try:
        client.set(key, value, px=ttl_ms)
    finally:
        client.close()


def token_of(value: bytes) -> str:
    return value.split(b":", 1)[0].decode()


def test_glob_escape_makes_every_special_character_literal():
    assert glob_escape(r"a*b?c[d]e\f") == r"a\*b\?c\[d\]e\\f"
    assert glob_escape("plain:prefix-") == "plain:prefix-"


def test_fingerprint_is_short_sha256_of_the_token_only():
    value = f'{FOREIGN_TOKEN}:{{"host":"h","pid":1}}'.encode()
    fp, owner = parse_value(value)
    assert (
        fp == hashlib.sha256(FOREIGN_TOKEN.encode()).hexdigest()[:8] == fingerprint(FOREIGN_TOKEN)
    )
    assert (owner.host, owner.pid) == ("h", 1)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"garbage", "not <32 hex token>:<owner>"),
        (b"tok:{}", "not <32 hex token>:<owner>"),
        (FOREIGN_TOKEN.encode() + b":not json", "not a flat JSON object"),
        (FOREIGN_TOKEN.encode() + b":" + b"x" * 8200, "8233 bytes, longer than"),
        (FOREIGN_TOKEN.encode() + b":" + b'{"a":' * 1300 + b"1" + b"}" * 1300, "not a flat"),
        (FOREIGN_TOKEN.encode() + b':{"a":' + b"[" * 900 + b"]" * 900 + b"}", "not a flat JSON"),
        (FOREIGN_TOKEN.encode() + b':{"a": "[{"} ,', "not valid JSON"),
        (FOREIGN_TOKEN.encode() + b':{"host":"\xff"}', "not UTF-8"),
    ],
)
def test_a_value_in_another_shape_is_refused_with_a_reason(value, reason):
    with pytest.raises(UnreadableValue, match=re.escape(reason)):
        parse_value(value)


def test_lists_each_lock_once_with_holder_ttls_and_owner(masters, redlock_of):
    locks = redlock_of(masters)
    with locks.lock("invoice:42", ttl=20, label="billing"), locks.lock("report", ttl=10):
        found = list_locks(locks)
        values = raw_values(masters, locks.lock_key("invoice:42"))
    assert found.total == 2
    assert [lock.resource for lock in found.locks] == ["invoice:42", "report"]
    invoice = found.locks[0]
    assert (invoice.held_on, invoice.node_count, invoice.quorum) == (5, 5, 3)
    assert invoice.has_quorum
    assert invoice.stale == ()
    assert invoice.fingerprint == fingerprint(token_of(values[0]))
    assert invoice.owner.label == "billing"
    assert invoice.owner.ttl == 20
    assert invoice.owner.since == pytest.approx(time.time(), abs=60)
    assert 15 < invoice.min_ttl <= invoice.max_ttl <= 20
    assert 0 < invoice.validity <= invoice.min_ttl
    assert token_of(values[0]) not in repr(found)  # the token never leaves the module
    assert not found.failures


def test_prefix_with_glob_characters_lists_only_its_own_keys(masters, redlock_of):
    locks = redlock_of(masters, key_prefix="a*[b]?\\:")
    # Matches the prefix read as an unescaped glob ("a", anything, "b", any char, ":").
    for m in masters:
        put(m, "aZZbQ:lock:foreign", f"{FOREIGN_TOKEN}:{{}}")
    with locks.lock("mine"):
        found = list_locks(locks)
    assert [lock.resource for lock in found.locks] == ["mine"]


def test_a_different_token_on_a_minority_is_a_stale_copy(masters, redlock_of):
    locks = redlock_of(masters)
    with locks.lock("order:7", ttl=20):
        put(masters[4], locks.lock_key("order:7"), f'{FOREIGN_TOKEN}:{{"host":"old"}}', 5000)
        lock = inspect(locks, "order:7")
    assert lock is not None
    assert lock.held_on == 4
    assert lock.has_quorum
    assert [(c.node, c.fingerprint, c.owner.host) for c in lock.stale] == [
        (masters[4].url, fingerprint(FOREIGN_TOKEN), "old")
    ]
    assert lock.fingerprint != fingerprint(FOREIGN_TOKEN)


def test_a_lone_copy_below_quorum_is_stale_and_not_held(masters, redlock_of):
    locks = redlock_of(masters)
    put(masters[2], locks.lock_key("orphan"), f'{FOREIGN_TOKEN}:{{"pid":99}}')
    lock = inspect(locks, "orphan")
    assert lock is not None
    assert (lock.held_on, lock.has_quorum, lock.validity) == (1, False, 0.0)
    assert [c.node for c in lock.stale] == [masters[2].url]
    assert inspect(locks, "nothing-here") is None


def test_fence_is_the_highest_counter_over_masters(masters, redlock_of):
    locks = redlock_of(masters)
    for m, counter in zip(masters, [3, 9, None, 4, 1], strict=True):
        if counter is not None:
            put(m, locks.fence_key("fenced"), counter)
    with locks.lock("fenced"), locks.lock("unfenced"):
        found = list_locks(locks)
    assert {lock.resource: lock.fence for lock in found.locks} == {"fenced": 9, "unfenced": None}


def test_pages_and_search(masters, redlock_of):
    locks = redlock_of(masters)
    names = ["a:1", "a:2", "b*1", "b:2", "c:1"]
    held = [locks.lock(name, ttl=20).acquire() for name in names]
    try:
        pages = [list_locks(locks, page=p, page_size=2) for p in (1, 2, 3, 99)]
        assert [[lock.resource for lock in page.locks] for page in pages] == [
            ["a:1", "a:2"],
            ["b*1", "b:2"],
            ["c:1"],
            ["c:1"],  # past the end: the last page
        ]
        assert (pages[0].total, pages[0].pages, pages[0].has_next, pages[0].has_previous) == (
            5,
            3,
            True,
            False,
        )
        assert [lock.resource for lock in list_locks(locks, search=":2").locks] == ["a:2", "b:2"]
        # Search text is literal, glob characters included.
        assert [lock.resource for lock in list_locks(locks, search="*").locks] == ["b*1"]
        assert list_locks(locks, search="zzz").total == 0
    finally:
        for lock in held:
            lock.release()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"search": "x" * 201}, "search must be"),
        ({"page": 0}, "page must be"),
        ({"page_size": 0}, "page_size must be"),
        ({"page_size": True}, "page_size must be"),
    ],
)
def test_bad_listing_input_is_refused_before_any_network_call(options, message):
    unreachable = Redlock(["redis://127.0.0.1:1/0"])  # nothing listens: a call would fail
    with pytest.raises(ValueError, match=message):
        list_locks(unreachable, **options)


def test_bad_release_input_is_refused_before_any_network_call():
    unreachable = Redlock(["redis://127.0.0.1:1/0"])
    with pytest.raises(ValueError, match="fingerprint must be 8 lowercase hex digits, got 'XYZ'"):
        force_release(unreachable, "r", "XYZ")
    with pytest.raises(ValueError, match="resource"):
        force_release(unreachable, "", "0123abcd")


def test_an_unreachable_master_is_reported_and_the_rest_listed(fresh_masters, redlock_of):
    masters = fresh_masters(3)
    locks = redlock_of(masters)
    with locks.lock("survivor", ttl=20):
        masters[0].kill()
        found = list_locks(locks, timeout=0.5)
    assert [f.node for f in found.failures] == [masters[0].url]
    assert [(lock.resource, lock.held_on) for lock in found.locks] == [("survivor", 2)]


def test_force_release_deletes_that_holder_on_every_master(masters, redlock_of):
    locks = redlock_of(masters)
    lock = locks.lock("stuck", ttl=30).acquire()
    seen = inspect(locks, "stuck")
    assert seen is not None
    result = force_release(locks, "stuck", seen.fingerprint)
    assert result.released_on == 5
    assert all(o.released and o.detail == "released" for o in result.outcomes)
    assert raw_values(masters, locks.lock_key("stuck")) == [None] * 5
    with pytest.raises(LockLost):
        lock.release()  # the old holder's release finds nothing of its own, and says so


def test_force_release_spares_a_new_holder_that_took_the_lock_since(masters, redlock_of):
    locks = redlock_of(masters)
    old = locks.lock("seat:12", ttl=30).acquire()
    shown = inspect(locks, "seat:12")
    assert shown is not None
    old.release()  # between the confirmation page and the POST, the holder changes
    new = locks.lock("seat:12", ttl=30).acquire()
    before = raw_values(masters, locks.lock_key("seat:12"))
    result = force_release(locks, "seat:12", shown.fingerprint)
    assert result.owner is None
    assert result.released_on == 0
    assert "nothing released" in result.describe()
    assert raw_values(masters, locks.lock_key("seat:12")) == before
    new.release()


def test_force_release_removes_only_the_matching_copies(masters, redlock_of):
    locks = redlock_of(masters)
    key = locks.lock_key("mixed")
    with locks.lock("mixed", ttl=30):
        put(masters[0], key, f'{FOREIGN_TOKEN}:{{"host":"stale"}}')
        current = raw_values(masters, key)
        result = force_release(locks, "mixed", fingerprint(FOREIGN_TOKEN))
        after = raw_values(masters, key)
    assert [o.released for o in result.outcomes] == [True, False, False, False, False]
    assert after == [None, *current[1:]]
    assert result.owner is not None
    assert result.owner.host == "stale"
    assert FOREIGN_TOKEN not in result.describe()


def test_describe_never_contains_a_token(masters, redlock_of):
    locks = redlock_of(masters)
    locks.lock("secretive", ttl=30).acquire()
    token = token_of(raw_values(masters, locks.lock_key("secretive"))[0])
    shown = inspect(locks, "secretive")
    assert shown is not None
    text = force_release(locks, "secretive", shown.fingerprint).describe()
    assert token not in text
    assert shown.fingerprint in text
    assert re.search(r"released on 5 of 5 masters", text)


def test_after_a_forced_release_check_gives_the_watchdogs_reason(masters, redlock_of):
    """One reason everywhere: was "its lease ran out" from ``check()`` while the watchdog (and
    ``on_lost``) had said "released by force"."""
    told: list[str] = []
    noticed = threading.Event()

    def on_lost(lock, error) -> None:
        told.append(str(error))
        noticed.set()

    locks = redlock_of(masters)
    lock = locks.lock("stuck", ttl=1.5, auto_extend=True, on_lost=on_lost).acquire()
    seen = inspect(locks, "stuck")
    assert seen is not None
    force_release(locks, "stuck", seen.fingerprint)
    assert noticed.wait(3)  # the watchdog's next renewal (every 0.5 s) finds it gone
    assert "released by force" in told[0]
    with pytest.raises(LockLost) as checked:
        lock.check()
    assert str(checked.value) == told[0]
    with pytest.raises(LockLost):
        lock.release()
