"""A semaphore's permits and a readers/writer lock's readers, seen by operators: ``holder()``,
the inventory (``redlock_status``, text and JSON, and the admin page) show each permit and reader
as a holder row of its group, and the group's permits in use out of N; force release works per
holder and wakes who waits. Real masters."""

from __future__ import annotations

import io
import json
import re
import threading
import time

import pytest
from django.core.management import call_command

from django_redlock import conf, holder
from django_redlock.engine.algorithm import procedures
from django_redlock.operations.force_release import force_release
from django_redlock.operations.inventory import inspect, list_locks
from tests.conftest import wait_until

LIST_URL = "/admin/django_redlock/heldlock/"


@pytest.fixture
def engine(redlock_settings, settings):
    # A node budget for a loaded machine: these tests take their locks without waiting, and a
    # fresh engine's first round also connects (0.05 s for five connects was missed at load 6).
    settings.REDLOCK = {**settings.REDLOCK, "NODE_TIMEOUT": 0.5}
    return conf.get_redlock()


def test_holder_names_each_permit_and_reader(engine):
    with engine.lock("exports", limit=3, label="export a"), engine.lock("exports", limit=3):
        found = holder("exports")
        assert found is not None
        assert (found.mode, found.limit, found.masters) == ("permits", 3, 5)
        assert len(found.holders) == 2
        assert {h.resource.rpartition("#")[0] for h in found.holders} == {"exports"}
        assert sum("label 'export a'" in str(h.owner) for h in found.holders) == 1
    with engine.lock("prices", shared=True), engine.lock("prices", shared=True):
        readers = holder("prices")
        assert readers is not None
        assert readers.mode == "readers"
        assert len(readers.holders) == 2
    with engine.lock("plain"):
        plain = holder("plain")
        assert plain is not None
        assert (plain.mode, plain.holders) == ("lock", ())


def test_inventory_groups_permits_and_readers(engine):
    with (
        engine.lock("exports", limit=3),
        engine.lock("exports", limit=3),
        engine.lock("prices", shared=True),
    ):
        found = list_locks(engine)
    rows = {lock.resource: lock for lock in found.locks}
    permits = [r for r in rows.values() if r.mode == "permit"]
    readers = [r for r in rows.values() if r.mode == "reader"]
    assert len(permits) == 2
    assert {(p.group, p.limit) for p in permits} == {("exports", 3)}
    assert [(r.group, r.mode) for r in readers] == [("prices", "reader")]
    assert "exports" not in rows  # the marker is no holder...
    assert found.unreadable == ()  # ...and no unreadable key either
    assert [g.describe() for g in found.groups] == [
        "exports: 2 of 3 permits in use",
        "prices: 1 reader",
    ]


def test_redlock_status_shows_permits_in_use(engine):
    with engine.lock("exports", limit=3), engine.lock("prices", shared=True):
        text, data = io.StringIO(), io.StringIO()
        call_command("redlock_status", "--wide", stdout=text)
        call_command("redlock_status", "--json", stdout=data)
    assert "exports: 1 of 3 permits in use" in text.getvalue()
    assert "(permit of exports, limit 3)" in text.getvalue()
    assert "(reader of prices)" in text.getvalue()
    groups = json.loads(data.getvalue())["locks"]["groups"]
    assert {(g["name"], g["mode"], g["limit"], g["in_use"]) for g in groups} == {
        ("exports", "permits", 3, 1),
        ("prices", "readers", None, 1),
    }


def test_admin_page_shows_groups(admin_client, engine):
    with engine.lock("exports", limit=2):
        html = admin_client.get(LIST_URL).content.decode()
    assert "exports: 1 of 2 permits in use" in html
    assert "permit of exports (limit 2)" in html


def test_force_release_of_one_permit_wakes_the_semaphore_waiter(
    engine, redlock_settings, monkeypatch
):
    engine.retry_delay = 5.0  # only a notice can wake the waiter in time
    # ... nor a poll: a permit's waiter sleeps in ``wait_turn`` with its default bound (the
    # safety poll as it was when ``procedures`` was loaded), put off past the test here, so
    # that the bound below can leave a loaded machine seconds.
    monkeypatch.setattr(procedures.wait_turn, "__defaults__", (30.0,))
    holders = [engine.lock("jobs", limit=2, ttl=10).acquire() for _ in range(2)]
    got: list[float] = []

    def waiter() -> None:
        with engine.lock("jobs", limit=2, ttl=10, wait=10):
            got.append(time.monotonic())

    thread = threading.Thread(target=waiter)
    thread.start()
    queue_key = engine.queue_key("jobs")
    assert wait_until(lambda: all(m.call("ZCARD", queue_key) == 1 for m in redlock_settings), 10)
    slot = holders[0].slot
    shown = inspect(engine, "jobs", slot=slot)
    assert shown is not None
    assert (shown.mode, shown.group, shown.slot, shown.limit) == ("permit", "jobs", slot, 2)
    released_at = time.monotonic()
    outcome = force_release(engine, "jobs", shown.fingerprint, slot=slot)
    thread.join(10)
    assert outcome.released_on == 5
    assert got
    assert got[0] - released_at < 2.0
    assert not holders[0].owned()
    assert holders[1].owned()  # the other permit is untouched
    holders[1].release()


def test_a_plain_lock_named_like_a_permit_is_listed_apart(engine):
    """A plain lock ``exports#0`` and permit 0 of ``exports`` are two keys and two rows (before,
    they were one key, and the lock's holder showed as the semaphore's permit)."""
    with engine.lock("exports", limit=3) as permit:
        slot = permit.slot
        name = f"exports#{slot}"
        with engine.lock(name, label="plain"):
            found = list_locks(engine, search="exports")
            text = io.StringIO()
            call_command("redlock_status", "--wide", stdout=text)
    rows = sorted((r.resource, r.mode, r.slot) for r in found.locks)
    assert rows == [(name, "lock", None), (name, "permit", slot)]
    plain = next(r for r in found.locks if r.mode == "lock")
    assert "label 'plain'" in str(plain.owner)
    assert [g.describe() for g in found.groups] == ["exports: 1 of 3 permits in use"]
    assert f"{name} (permit of exports, limit 3)" in text.getvalue()


def test_a_permit_is_listed_with_its_limit_when_its_marker_is_on_another_page(engine):
    with engine.lock("aaa", limit=2), engine.lock("aaa", limit=2):
        found = list_locks(engine, page_size=1, page=2)  # "aaa" (the marker), then its permits
    assert [(r.mode, r.group, r.limit) for r in found.locks] == [("permit", "aaa", 2)]


def test_foreign_keys_among_the_slots_are_skipped_or_shown_unreadable(engine, redlock_settings):
    """Keys of the slot kind that no semaphore wrote: a name without ``#<slot>`` (or with one
    that is not how a slot is written) is none of ours and not listed; a slot's key holding
    something else than a lock value is an unreadable key, as under the lock kind."""
    for m in redlock_settings:
        m.call("SET", "redlock:slot:junk", "x")
        m.call("SET", "redlock:slot:pad#007", "x")
        m.call("SET", "redlock:slot:odd#1", "not a lock value")
        m.call("HSET", "redlock:slot:hash#2", "a", "b")
    found = list_locks(engine)
    assert found.locks == ()
    assert found.total == 2
    assert sorted({(u.resource, u.kind) for u in found.unreadable}) == [
        ("hash#2", "hash"),
        ("odd#1", "string"),
    ]


def test_a_permit_whose_marker_is_gone_is_still_a_permit(engine, redlock_settings):
    """Its key says what it is; only the limit is unknown (the marker deleted by hand)."""
    with engine.lock("orphan", limit=2):
        for m in redlock_settings:
            m.call("DEL", "redlock:lock:orphan")
        found = list_locks(engine)
        text = io.StringIO()
        call_command("redlock_status", "--wide", stdout=text)
    assert [(r.mode, r.group, r.limit) for r in found.locks] == [("permit", "orphan", None)]
    assert "(permit of orphan)" in text.getvalue()


def test_admin_force_release_of_a_permit_leaves_a_lock_of_the_same_name(admin_client, engine):
    permit = engine.lock("jobs", limit=2, ttl=30).acquire()
    plain = engine.lock(f"jobs#{permit.slot}", ttl=30).acquire()
    listing = admin_client.get(LIST_URL).content.decode()
    links = [
        link.replace("&amp;", "&") for link in re.findall(r'href="([^"]*release/\?[^"]*)"', listing)
    ]
    assert len(links) == 2
    [link] = [link for link in links if "slot=" in link]  # the permit's, not the lock's
    confirm = admin_client.get(link).content.decode()
    assert f"jobs#{permit.slot}" in confirm
    form = dict(re.findall(r'name="(ref|slot|fingerprint)" value="([^"]*)"', confirm))
    assert form["slot"] == str(permit.slot)
    done = admin_client.post(f"{LIST_URL}release/", form)
    assert done.status_code == 302, done.content
    assert not permit.owned()
    assert plain.owned()
    plain.release()
    for slot in ("x", "-1", "10000", "%EF%BC%91", ""):  # (%EF%BC%91: a fullwidth "1")
        bad = admin_client.get(link.replace(f"slot={permit.slot}", f"slot={slot}"))
        assert bad.status_code == 400, slot
        assert "slot must be" in bad.content.decode()


def test_force_release_of_a_reader_lets_the_writer_in(engine):
    reader = engine.lock("menu", shared=True, ttl=10).acquire()
    rows = [r for r in list_locks(engine).locks if r.mode == "reader"]
    assert len(rows) == 1
    force_release(engine, rows[0].resource, rows[0].fingerprint)
    assert not reader.owned()
    with engine.lock("menu") as writer:  # the marker went with the last reader
        assert writer.held


def test_metrics_count_permits_in_use_and_waiting(engine):
    from prometheus_client import REGISTRY

    from django_redlock.contrib import prometheus

    assert prometheus.enabled()

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name, {"name": "reports"}) or 0.0

    first = engine.lock("reports", limit=1, ttl=10).acquire()
    waiting = threading.Thread(
        target=lambda: engine.lock("reports", limit=1, ttl=10, wait=10).acquire().release()
    )
    waiting.start()
    counts = lambda: (sample("redlock_permits_in_use"), sample("redlock_permits_waiting"))  # noqa: E731
    assert wait_until(lambda: counts() == (1, 1), 10), counts()
    first.release()
    waiting.join(10)
    assert (sample("redlock_permits_in_use"), sample("redlock_permits_waiting")) == (0, 0)
