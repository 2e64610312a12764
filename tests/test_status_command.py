"""``manage.py redlock_status`` and the per-master probe, against real masters."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from django_redlock import conf
from django_redlock.operations.health import probe_all
from django_redlock.testing.proxy import DelayProxy
from tests.conftest import manage_py

ROOT = Path(__file__).resolve().parent.parent


def status(*args: str) -> str:
    out = StringIO()
    call_command("redlock_status", *args, stdout=out)
    return out.getvalue()


def status_and_exit(*args: str) -> tuple[int, str]:
    """The output and exit status, whatever the verdict."""
    out = StringIO()
    try:
        call_command("redlock_status", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def tokens(masters, key: str) -> list[str]:
    found = []
    for m in masters:
        client = m.client()
        try:
            value = client.get(key)
        finally:
            client.close()
        if value is not None:
            found.append(value.split(b":", 1)[0].decode())
    return found


def configure(settings, masters) -> None:
    settings.REDLOCK = {"NODES": [m.url for m in masters]}


def test_reports_every_master_and_the_held_locks_without_tokens(redlock_settings):
    masters = redlock_settings
    engine = conf.get_redlock()
    with engine.lock("invoice:42", ttl=20, label="billing"), engine.lock("report", ttl=20) as rep:
        fence = rep.fence
        text = status("--wide")
        secret = tokens(masters, engine.lock_key("invoice:42")) + tokens(
            masters, engine.lock_key("report")
        )
    assert "5 of 5 masters reachable, quorum 3: OK (can lose 2 more masters)" in text
    for m in masters:
        assert m.url in text
    assert "noeviction" in text
    assert "master" in text
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert "5/5" in lines["invoice:42"]
    assert "label 'billing'" in lines["invoice:42"]
    assert f" {fence} " in lines["report"]
    assert len(secret) == 10
    assert not any(token in text for token in secret)


def test_password_in_a_node_url_is_masked(settings, fresh_masters):
    [master] = fresh_masters(1)
    client = master.client()
    try:
        client.config_set("requirepass", "hunter2")
    finally:
        client.close()
    settings.REDLOCK = {"NODES": [master.url.replace("redis://", "redis://:hunter2@")]}
    code, text = status_and_exit()
    assert code == 0  # the password was used...
    assert "1 of 1 masters reachable, quorum 1: OK" in text
    assert "redis://:***@127.0.0.1" in text
    assert "hunter2" not in text  # ...and never shown


def test_json_output_parses_and_holds_the_same_facts(redlock_settings):
    engine = conf.get_redlock()
    with engine.lock("invoice:42", ttl=20):
        data = json.loads(status("--json"))
        secret = tokens(redlock_settings, engine.lock_key("invoice:42"))
    assert data["healthy"] is True
    assert (data["quorum"], data["reachable"]) == (3, 5)
    assert [m["node"] for m in data["masters"]] == [m.url for m in redlock_settings]
    assert all(m["reachable"] and m["role"] == "master" for m in data["masters"])
    [lock] = data["locks"]["items"]
    assert (lock["resource"], lock["held_on"], lock["has_quorum"]) == ("invoice:42", 5, True)
    assert 15 < lock["min_ttl"] <= lock["max_ttl"] <= 20
    assert not any(token in json.dumps(data) for token in secret)


def test_search_and_limit(redlock_settings):
    engine = conf.get_redlock()
    with engine.lock("a:1"), engine.lock("a:2"), engine.lock("b:1"):
        only_a = json.loads(status("--json", "--search", "a:"))
        first = json.loads(status("--json", "--limit", "2"))
    assert [lock["resource"] for lock in only_a["locks"]["items"]] == ["a:1", "a:2"]
    assert [lock["resource"] for lock in first["locks"]["items"]] == ["a:1", "a:2"]
    assert (first["locks"]["total"], first["locks"]["pages"]) == (3, 2)


def test_three_verdicts_with_their_exit_statuses_and_unknown_copies(settings, fresh_masters):
    """OK while masters may still fail; DEGRADED when one more failure stops locking; NO QUORUM.
    A lock's copies on masters that cannot be read are unknown: never called stale."""
    masters = fresh_masters(5)
    configure(settings, masters)
    # (Left to expire: masters go down. It may wait: a cold first round on five fresh masters
    # has missed the 50 ms node budget on a loaded machine.)
    conf.get_redlock().lock("invoice:42", ttl=60, wait=10).acquire()
    seen = []
    for master in masters[:3]:
        master.kill()
        seen.append(status_and_exit("--timeout", "0.3"))
    assert [code for code, _ in seen] == [0, 1, 2]
    assert "4 of 5 masters reachable, quorum 3: OK (can lose 1 more master)" in seen[0][1]
    assert "3 of 5 masters reachable, quorum 3: DEGRADED (can lose no more masters" in seen[1][1]
    assert "2 of 5 masters reachable, quorum 3: NO QUORUM" in seen[2][1]
    no_quorum = seen[2][1]
    assert re.search(r"state +unknown", no_quorum)  # 2 copies read, 3 masters unread
    assert re.search(r"stale copies +-", no_quorum)


def test_exit_status_of_the_real_command(fresh_masters, tmp_path):
    """As monitoring or cron sees it: exit 0 when OK, 2 without a quorum."""
    masters = fresh_masters(3)
    env = {"REDLOCK_NODES": ",".join(m.url for m in masters), "REDLOCK_DEMO_DIR": str(tmp_path)}

    def run() -> subprocess.CompletedProcess[str]:
        return manage_py("redlock_status", "--json", env=env)

    healthy = run()
    assert healthy.returncode == 0, healthy.stderr
    assert json.loads(healthy.stdout)["healthy"] is True
    masters[0].kill()
    masters[1].kill()
    broken = run()
    assert broken.returncode == 2
    assert json.loads(broken.stdout)["verdict"] == "NO QUORUM"
    assert "NO QUORUM" in broken.stderr  # stdout is for machines: the human reads stderr
    assert "Traceback" not in broken.stderr
    as_text = manage_py("redlock_status", env=env)
    assert as_text.returncode == 2
    assert as_text.stdout.count("NO QUORUM") == 1  # the verdict, said once
    assert as_text.stderr == ""  # was: "CommandError: ... NO QUORUM ..." a second time


def test_a_broken_setting_exits_3_and_says_error_under_json(settings):
    """Not a verdict about the masters (they were never asked): 3, UNKNOWN to monitoring; was 1,
    as for DEGRADED, and --json printed nothing."""
    settings.REDLOCK = {"NODES": []}
    out = StringIO()
    with pytest.raises(CommandError, match=r"REDLOCK\['NODES'\] is empty") as raised:
        call_command("redlock_status", "--json", stdout=out)
    assert raised.value.returncode == 3
    data = json.loads(out.getvalue())
    assert data["verdict"] == "ERROR"
    assert "REDLOCK['NODES'] is empty" in data["error"]
    assert status_and_exit()[0] == 3


def test_one_master_is_ok_without_fault_tolerance(settings, fresh_masters):
    """Development's single master: it answers, so locking works; nothing to degrade. Was
    DEGRADED (exit 1) while `manage.py check` said nothing."""
    [master] = fresh_masters(1)
    configure(settings, [master])
    code, text = status_and_exit()
    assert code == 0
    assert "1 of 1 masters reachable, quorum 1: OK (single master, no fault tolerance)" in text
    assert json.loads(status_and_exit("--json")[1])["verdict"] == "OK"
    master.kill()
    code, text = status_and_exit("--timeout", "0.3")
    assert code == 2
    assert "0 of 1 masters reachable, quorum 1: NO QUORUM" in text


@pytest.fixture
def not_redis():
    """A TCP port that answers like a web server: it speaks, but not the Redis protocol."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    conn.recv(1024)
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_wrong_password_and_a_port_that_is_not_redis_say_so(settings, fresh_masters, not_redis):
    """Was: both "unreachable", the second with a bare protocol error."""
    masters = fresh_masters(2)
    client = masters[0].client()
    try:
        client.config_set("requirepass", "right")
    finally:
        client.close()
    wrong = masters[0].url.replace("redis://", "redis://:wrong@")
    settings.REDLOCK = {"NODES": [wrong, masters[1].url, f"redis://127.0.0.1:{not_redis}/0"]}
    code, text = status_and_exit("--wide", "--timeout", "0.5")
    assert code == 2
    assert "redis://:***@127.0.0.1" in text
    assert re.search(r"redis://:\*\*\*@127\.0\.0\.1:\d+/0: authentication failed", text)
    assert f"127.0.0.1:{not_redis}/0: not a Redis server? it answered outside the Redis" in text
    assert "unreachable" not in text


def test_bad_setting_is_a_clear_command_error(settings):
    settings.REDLOCK = {"NODES": []}
    with pytest.raises(CommandError, match=r"REDLOCK setting: REDLOCK\['NODES'\] is empty"):
        status()


def test_warns_about_a_replica_and_an_evicting_master(settings, fresh_masters):
    masters = fresh_masters(3)
    primary, replica, evicting = masters
    client = replica.client()
    try:
        client.replicaof("127.0.0.1", primary.port)
    finally:
        client.close()
    client = evicting.client()
    try:
        client.config_set("maxmemory-policy", "allkeys-lru")
    finally:
        client.close()
    configure(settings, masters)
    text = status()
    assert f"{replica.url}: role is 'slave', not master" in text
    assert f"{evicting.url}: maxmemory-policy is 'allkeys-lru'" in text
    assert f"{primary.url}: role" not in text
    assert "3 of 3 masters reachable" in text  # warnings do not change the verdict
    by_node = {n.node: n for n in probe_all(conf.get_redlock()).nodes}
    assert by_node[replica.url].role == "slave"
    assert by_node[evicting.url].maxmemory_policy == "allkeys-lru"
    assert by_node[primary.url].maxmemory_policy == "noeviction"


def test_probe_reads_persistence_version_and_clock(redlock_settings):
    health = probe_all(conf.get_redlock())
    assert health.has_quorum
    for node in health.nodes:
        assert node.reachable
        assert node.appendonly == "no"  # how the test masters are started
        assert node.appendfsync in ("always", "everysec", "no")
        assert node.version[0].isdigit()
        assert abs(node.clock_skew) < 1.0  # same machine, same clock
        assert 0 < node.rtt < 1.0
        assert any("appendonly=no" in w for w in node.warnings)


def test_paused_masters_cost_one_timeout_not_one_each(settings, fresh_masters):
    masters = fresh_masters(5)
    configure(settings, masters)
    for m in masters[:3]:
        m.pause()
    try:
        started = time.monotonic()
        health = probe_all(conf.get_redlock(), timeout=0.5)
        elapsed = time.monotonic() - started
    finally:
        for m in masters[:3]:
            m.resume()
    assert [n.reachable for n in health.nodes] == [False, False, False, True, True]
    assert not health.has_quorum
    assert elapsed < 1.4  # one after another would take at least 3 x 0.5 s


def test_one_redis_server_behind_two_entries_is_an_error_and_votes_once(settings, fresh_masters):
    """A name the check cannot see through (here a TCP proxy; in production a DNS alias) reaches
    a server already listed: the run_id tells, and the verdict counts that server once."""
    masters = fresh_masters(2)
    with DelayProxy(masters[0].port) as alias:
        settings.REDLOCK = {"NODES": [masters[0].url, masters[1].url, alias.url]}
        code, text = status_and_exit("--wide")
        data = json.loads(status_and_exit("--json")[1])
    assert code == 1  # 2 real masters for a quorum of 2: DEGRADED, not OK
    assert "2 of 3 masters reachable, quorum 2: DEGRADED" in text
    assert "Errors:" in text
    assert f"{masters[0].url} and {alias.url} are one redis-server" in text
    assert data["verdict"] == "DEGRADED"
    assert data["errors"] == [line for line in data["errors"] if "one redis-server" in line]
    assert len(data["errors"]) == 1


def test_fits_in_100_columns_and_says_a_shared_warning_once(settings, fresh_masters):
    """Was: lines of 247-289 columns, and the persistence warning once per master when one was
    down. --wide keeps the full table for those who want it."""
    masters = fresh_masters(5)
    configure(settings, masters)
    engine = conf.get_redlock()
    names = ["invoice:42", "report:" + "x" * 150, "seat:\x1b[31mred\r"]
    held = [engine.lock(names[0], ttl=30, label="a label of some length, for the owner").acquire()]
    held += [engine.lock(n, ttl=30).acquire() for n in names[1:]]
    masters[4].kill()
    code, text = status_and_exit("--timeout", "0.3")
    wide = status_and_exit("--wide", "--timeout", "0.3")[1]
    for lock in held:
        lock.release()
    assert code == 0
    assert max(len(line) for line in text.splitlines()) <= 100, text
    assert max(len(line) for line in wide.splitlines()) > 100
    assert text.count("appendonly=no") == 1
    assert "every reachable master: persistence appendonly=no" in text
    assert "seat:\\x1b[31mred\\r" in text
    assert "\x1b" not in text
