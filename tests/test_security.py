"""Security: tokens never leave the masters (logs, command output, admin HTML); a Redis ACL user
limited to the key prefix is enough, and nothing more is reachable with it; ``rediss://`` with
certificate checks works, and a wrong CA is refused. Real redis-server processes throughout."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import logging
import os
import shutil
import subprocess
import threading
import time
from io import StringIO
from pathlib import Path

import pytest
import redis
from django.contrib.admin.models import LogEntry
from django.core.management import call_command

from django_redlock import (
    LockContended,
    LockLost,
    QuorumUnavailable,
    conf,
    redlock,
    views,
)
from django_redlock.engine import Redlock
from django_redlock.engine.algorithm import procedures
from django_redlock.operations import force_release, inventory
from django_redlock.testing.masters import (
    LocalMaster,
    find_redis_server,
    free_port,
    redis_server_version,
)
from tests.conftest import hand_off_time, wait_until

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/django_redlock/heldlock/"
RELEASE_URL = "/admin/django_redlock/heldlock/release/"


def tokens_on(masters: list[LocalMaster], key: str) -> set[str]:
    """The 32-hex tokens stored under ``key`` on the masters (read directly, as an attacker
    with server access would)."""
    found = set()
    for m in masters:
        client = m.client()
        try:
            value = client.get(key)
        finally:
            client.close()
        if value is not None:
            token = value.split(b":", 1)[0].decode()
            assert len(token) == 32
            found.add(token)
    return found


def assert_no_token(text: str, tokens: set[str]) -> None:
    assert tokens, "no tokens collected: the check would prove nothing"
    leaked = [t for t in tokens if t in text]
    assert not leaked, f"token(s) {leaked} found in: {text[:2000]}"


# --- tokens stay secret ---


def test_no_log_record_carries_a_token(redlock_settings, caplog):
    """DEBUG logging across acquire, extend, fence, release, contention, a lost lease (from the
    block and from the watchdog) and a force release: every record's message, args and
    exception text is free of every token that was held."""
    masters = redlock_settings
    engine = conf.get_redlock()
    caplog.set_level(logging.DEBUG)
    secret: set[str] = set()

    with redlock("sec:plain", ttl=5, label="billing") as lock:
        secret |= tokens_on(masters, lock.key)
        lock.extend()
        assert lock.fence >= 1

    other_process = Redlock([m.url for m in masters])  # another owner: contention is real
    try:
        with other_process.lock("sec:busy", ttl=5) as holder:
            secret |= tokens_on(masters, holder.key)
            with pytest.raises(LockContended, match="held by another owner"):
                redlock("sec:busy", wait=0).acquire()
            with pytest.raises(LockContended, match="held by another owner"):
                redlock("sec:busy", wait=0.3).acquire()  # waits on release notices, gives up
    finally:
        other_process.close()

    expiring = redlock("sec:expires", ttl=1.0).acquire()
    secret |= tokens_on(masters, expiring.key)
    assert wait_until(lambda: all(m.call("EXISTS", expiring.key) == 0 for m in masters), 10)
    with pytest.raises(LockLost):
        expiring.__exit__(None, None, None)

    watched = redlock("sec:watched", ttl=1.0, auto_extend=True, max_extensions=0)
    watched.acquire()
    secret |= tokens_on(masters, watched.key)
    deadline = time.monotonic() + 10
    while not any("LOST 'sec:watched'" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "the watchdog did not report the lost lease"
        time.sleep(0.02)
    with pytest.raises(LockLost):
        watched.__exit__(None, None, None)

    with pytest.raises(LockLost), redlock("sec:forced", ttl=5) as forced:  # noqa: PT012
        secret |= tokens_on(masters, forced.key)
        shown = inventory.inspect(engine, "sec:forced")
        assert shown is not None
        force_release.force_release(engine, "sec:forced", shown.fingerprint)

    messages = [r.getMessage() for r in caplog.records]
    for wanted in ("acquired 'sec:plain' (billing)", "released 'sec:plain'", "not acquired"):
        assert any(wanted in m for m in messages), f"no record says {wanted!r}: {messages}"
    assert any("LOST 'sec:expires'" in m for m in messages)
    assert len(secret) == 5
    for record in caplog.records:
        text = " ".join(
            [record.getMessage(), str(record.msg), repr(record.args), record.exc_text or ""]
        )
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {record.exc_info[1]!r} {record.exc_info[1]}"
        assert_no_token(text, secret)


def test_error_messages_name_masters_not_tokens(redlock_settings, redlock_of):
    masters = redlock_settings
    with redlock_of(masters).lock("sec:error", ttl=5) as holder:
        secret = tokens_on(masters, holder.key)
        with pytest.raises(LockContended) as caught:
            redlock("sec:error", wait=0).acquire()
    text = f"{caught.value} {caught.value!r} {caught.value.failures}"
    assert masters[0].url in text
    assert_no_token(text, secret)


def test_redlock_status_shows_fingerprints_not_tokens(redlock_settings):
    masters = redlock_settings
    engine = conf.get_redlock()
    with redlock("sec:status", ttl=20, label="nightly") as lock:
        fence = lock.fence
        secret = tokens_on(masters, lock.key)
        text, as_json = StringIO(), StringIO()
        call_command("redlock_status", stdout=text)
        call_command("redlock_status", "--json", stdout=as_json)
        shown = inventory.inspect(engine, "sec:status")
    assert shown is not None
    for output in (text.getvalue(), as_json.getvalue()):
        assert "sec:status" in output
        assert shown.fingerprint in output
        assert_no_token(output, secret)
    assert str(fence) in as_json.getvalue()


def test_admin_pages_show_fingerprints_not_tokens(redlock_settings, client, django_user_model):
    """As a superuser (sees everything the admin can show): the list, the confirmation page, the
    success message after a force release, and the admin log entry."""
    masters = redlock_settings
    engine = conf.get_redlock()
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    with (  # noqa: PT012
        pytest.raises(LockLost),  # leaving: the admin took "sec:admin" away, and it says so
        redlock("sec:admin", ttl=20, label="report"),
        redlock("sec:other", ttl=20) as other,
    ):
        secret = tokens_on(masters, engine.lock_key("sec:admin")) | tokens_on(masters, other.key)
        shown = inventory.inspect(engine, "sec:admin")
        assert shown is not None
        listing = client.get(LIST_URL)
        form = {"ref": views.resource_ref("sec:admin"), "fingerprint": shown.fingerprint}
        confirm = client.get(RELEASE_URL, form)
        released = client.post(RELEASE_URL, form, follow=True)
    assert [r.status_code for r in (listing, confirm, released)] == [200, 200, 200]
    assert tokens_on(masters, engine.lock_key("sec:admin")) == set()  # it was released
    entry = LogEntry.objects.get()
    for page in (listing, confirm, released):
        html = page.content.decode()
        assert "sec:admin" in html
        assert shown.fingerprint in html
        assert_no_token(html, secret)
    assert_no_token(f"{entry.object_repr} {entry.change_message} {entry.object_id}", secret)


# --- a Redis ACL user limited to the key prefix ---

#: What the library sends: the lock path (SET, GET, EVALSHA/EVAL and, inside our scripts, DEL,
#: PEXPIRE, SET, PUBLISH, TIME, PTTL and the waiter queue's ZADD, ZREM, ZPOPMIN, ZCARD), release
#: notices (SUBSCRIBE), and the read-only status/admin probes (PING, INFO, TIME, SCAN, PTTL, and
#: TYPE, STRLEN, GETRANGE to read a key without trusting it: the inventory, and holder() inside a
#: script), and for semaphores and readers: MGET (their holders), the readers' sorted set and the
#: queued readers' set (ZRANGE, ZRANGEBYSCORE, ZREMRANGEBYSCORE, SADD, SREM, SISMEMBER). No
#: CONFIG: the status command must cope with its refusal.
LOCKER_RULES = [
    "reset", "on", ">pw", "~redlock:*", "resetchannels", "&redlock:*", "-@all",
    "+set", "+get", "+evalsha", "+eval", "+del", "+pexpire", "+publish",
    "+zadd", "+zrem", "+zpopmin", "+zcard",
    "+subscribe", "+unsubscribe", "+ping", "+info", "+time", "+scan", "+pttl",
    "+type", "+strlen", "+getrange", "+mget",
    "+sadd", "+srem", "+sismember", "+zrange", "+zrangebyscore", "+zremrangebyscore",
]  # fmt: skip


@pytest.fixture
def acl_masters(fresh_masters):
    """Three masters with a ``locker`` user restricted to ``redlock:*`` keys and channels."""
    if redis_server_version() < (6, 2):
        pytest.fail(f"redis-server {redis_server_version()} has no channel ACLs (needs 6.2)")
    masters = fresh_masters(3)
    for m in masters:
        client = m.client()
        try:
            client.execute_command("ACL", "SETUSER", "locker", *LOCKER_RULES)
        finally:
            client.close()
    return masters


def locker_urls(masters: list[LocalMaster]) -> list[str]:
    return [f"redis://locker:pw@127.0.0.1:{m.port}/0" for m in masters]


def test_an_acl_user_limited_to_the_prefix_can_lock_extend_fence_wait_and_release(acl_masters):
    engine = Redlock(locker_urls(acl_masters), node_timeout=0.2, retry_delay=3.0)
    try:
        with engine.lock("job", ttl=5) as lock:
            assert len(tokens_on(acl_masters, lock.key)) == 1  # on all three: one token
            assert lock.extend() > 4
            first = lock.fence
        with engine.lock("job", ttl=5) as lock:
            assert lock.fence > first
        assert tokens_on(acl_masters, engine.lock_key("job")) == set()

        # Waiting queues on the masters (ZADD on redlock:queue:job) and listens on the process's
        # inbox (SUBSCRIBE on redlock:wake:<id>): woken at once, not after the 1.5-3 s blind retry.
        # (Anything under 1.5 s is a notice: the blind retry comes 1.5-3 s after a failed try.)
        assert hand_off_time(engine, "job", settle=0.4) < 1.45
    finally:
        engine.close()


def test_the_acl_user_can_ask_who_holds_and_wait_for_several_resources(acl_masters, monkeypatch):
    """holder() reads capped (TYPE, STRLEN, GETRANGE in a script), and a lock over several
    resources waits in the masters' queues and passes a turn on (ZPOPMIN, ZADD, PUBLISH), all
    within the locker's rules: the single waiter behind it takes "a" at once (its safety poll
    put off past the test, its next try 3 s away: only the passed turn can wake it)."""
    monkeypatch.setattr(procedures, "SAFETY_POLL", 30.0)
    engines = [Redlock(locker_urls(acl_masters), node_timeout=0.2, retry_delay=3) for _ in "abc"]
    holders, pair_engine, single_engine = engines
    try:
        holding_a = holders.lock("a", ttl=10).acquire()
        holding_b = holders.lock("b", ttl=10).acquire()
        seen = holders.holder("a")
        assert seen is not None
        assert seen.masters == 3
        got_a: list[float] = []

        def single() -> None:
            with single_engine.lock("a", ttl=5, wait=5):
                got_a.append(time.monotonic())

        def both() -> None:
            with pair_engine.lock("a", "b", ttl=5, wait=5):
                pass

        def queued(counts: dict[str, int]) -> bool:
            return all(
                m.call("ZCARD", holders.queue_key(resource)) == count
                for m in acl_masters
                for resource, count in counts.items()
            )

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            pair = pool.submit(both)
            assert wait_until(lambda: queued({"a": 1, "b": 1}), 10)  # the pair, on "a" and "b"
            waiter = pool.submit(single)
            assert wait_until(lambda: queued({"a": 2, "b": 1}), 10)  # the single one behind it
            released = time.monotonic()
            holding_a.release()
            waiter.result(timeout=10)
            holding_b.release()
            pair.result(timeout=10)
        assert got_a[0] - released < 2.0
    finally:
        for engine in engines:
            engine.close()


def test_the_acl_user_can_take_permits_and_share_as_readers(acl_masters):
    """Semaphores (``limit``) and readers (``shared``) run their own scripts (slot scans, the
    readers set, queues by deadline): within the locker's rules too, waiting included."""
    engine = Redlock(locker_urls(acl_masters), node_timeout=0.2, retry_delay=3.0)
    try:
        one = engine.lock("pool", limit=2, ttl=5).acquire()
        with engine.lock("pool", limit=2, ttl=5):
            assert one.extend() > 4
            with pytest.raises(LockContended):
                engine.lock("pool", limit=2, ttl=5).acquire()
            held = engine.holder("pool")
            assert held is not None
            assert len(held.holders) == 2
            got: list[float] = []

            def third() -> None:
                with engine.lock("pool", limit=2, ttl=5, wait=5):
                    got.append(time.monotonic())

            waiter = threading.Thread(target=third)
            waiter.start()
            time.sleep(0.3)
            one.release()
            waiter.join(10)
            assert got, "the third caller never got a permit"
        with engine.lock("prices", shared=True, ttl=5) as a, engine.lock("prices", shared=True):
            assert a.extend() > 4
            held = engine.holder("prices")
            assert held is not None
            assert len(held.holders) == 2
            with pytest.raises(LockContended, match="held by readers"):
                engine.lock("prices", ttl=5).acquire()
        writer = engine.lock("prices", ttl=5).acquire()  # the writer, once the readers left
        read: list[float] = []

        def reader() -> None:  # queued behind the writer (the queued readers' set)
            with engine.lock("prices", shared=True, ttl=5, wait=5):
                read.append(time.monotonic())

        waiting = threading.Thread(target=reader)
        waiting.start()
        time.sleep(0.3)
        writer.release()
        waiting.join(10)
        assert read, "the reader queued behind the writer never got in"
        for master in acl_masters:  # (the semaphore's marker outlives its permits by its TTL)
            client = master.client()
            assert client.keys("redlock:lock:*") == [b"redlock:lock:pool"]
            assert 0 < client.pttl("redlock:lock:pool") <= 5000
            client.close()
    finally:
        engine.close()


def test_the_acl_user_is_refused_outside_the_prefix(acl_masters):
    outside = Redlock(locker_urls(acl_masters), key_prefix="other:", node_timeout=0.2)
    try:
        with pytest.raises(QuorumUnavailable) as caught:
            outside.lock("job", ttl=5).acquire()
    finally:
        outside.close()
    assert "NoPermissionError" in str(caught.value)
    assert ":pw@" not in str(caught.value)  # masked: locker:***@
    client = redis.Redis.from_url(locker_urls(acl_masters)[0])
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set("elsewhere", 1)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.publish("elsewhere", "")
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.flushall()
        assert client.publish("redlock:wake:someone", "") == 0  # inside: allowed
    finally:
        client.close()


def test_status_works_for_the_acl_user_and_masks_its_password(acl_masters, settings):
    settings.REDLOCK = {"NODES": locker_urls(acl_masters)}
    with redlock("job", ttl=20) as lock:
        secret = tokens_on(acl_masters, lock.key)
        out = StringIO()
        call_command("redlock_status", stdout=out)
    text = out.getvalue()
    assert "3 of 3 masters reachable" in text
    assert "locker:***@" in text
    assert ":pw@" not in text
    assert "job" in text
    assert_no_token(text, secret)


# --- rediss:// with certificate checks ---


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certificates(directory: Path, name: str) -> dict[str, Path]:
    """A throwaway CA and a server certificate it signed, for 127.0.0.1 (subjectAltName)."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {k: directory / f"{name}-{k}" for k in ("ca.crt", "ca.key", "server.crt", "server.key")}
    csr, ext = directory / f"{name}-server.csr", directory / f"{name}-san.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", str(files["ca.key"]), "-out", str(files["ca.crt"]),
            "-days", "1", "-subj", f"/CN={name} test CA")  # fmt: skip
    openssl("req", *ec, "-keyout", str(files["server.key"]), "-out", str(csr),
            "-subj", "/CN=127.0.0.1")  # fmt: skip
    openssl("x509", "-req", "-in", str(csr), "-CA", str(files["ca.crt"]),
            "-CAkey", str(files["ca.key"]), "-CAcreateserial", "-out", str(files["server.crt"]),
            "-days", "1", "-extfile", str(ext))  # fmt: skip
    return files


def no_tls(reason: str) -> None:
    """Without a TLS-enabled redis-server this test cannot run: a failure in CI (which installs
    Debian's, built with TLS), a loud skip elsewhere."""
    message = (
        f"NO TLS TEST: {reason}. Install Debian's redis-server (apt-get install redis-server) "
        f"or set REDLOCK_REDIS_SERVER to a TLS-enabled build."
    )
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@functools.cache
def tls_missing() -> str | None:
    """Why the configured redis-server cannot serve TLS, or None if it can. A build without TLS
    rejects the ``tls-*`` directives ("Bad directive"); a build with TLS gets past them and stops
    at the missing certificate."""
    if shutil.which("openssl") is None:
        return "no openssl command to make the throwaway CA with"
    binary = find_redis_server()
    probe = subprocess.run(
        [binary, "--port", "0", "--tls-port", str(free_port()), "--save", "",
         "--tls-cert-file", "/nonexistent.crt", "--tls-key-file", "/nonexistent.key"],
        capture_output=True, text=True, timeout=10, check=False,
    )  # fmt: skip
    output = probe.stdout + probe.stderr
    if "Bad directive" in output:
        return f"{binary} was built without TLS"
    return None


@pytest.fixture
def tls_masters(tmp_path):
    """Three masters that also listen with TLS (server certificate from a throwaway CA); their
    plain port is kept only for this test's own checks. Yields (masters, TLS ports, certs)."""
    missing = tls_missing()
    if missing:
        no_tls(missing)
    certs = make_certificates(tmp_path / "certs", "good")
    with contextlib.ExitStack() as stack:
        masters, ports = [], []
        for i in range(3):
            port = free_port()
            master = LocalMaster(
                tmp_path / f"tls{i}",
                None,
                "--tls-port", str(port),
                "--tls-cert-file", str(certs["server.crt"]),
                "--tls-key-file", str(certs["server.key"]),
                "--tls-ca-cert-file", str(certs["ca.crt"]),
                "--tls-auth-clients", "no",
            )  # fmt: skip
            try:
                master.start()
            except RuntimeError:
                master.stop()  # reaps it and closes its stderr pipe
                raise
            stack.callback(master.stop)
            masters.append(master)
            ports.append(port)
        yield masters, ports, certs


def rediss(port: int, ca: Path) -> str:
    return f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}&ssl_cert_reqs=required"


def subscribers(masters: list[LocalMaster], channel: str) -> list[int]:
    counts = []
    for m in masters:
        client = m.client()
        try:
            counts.append(dict(client.pubsub_numsub(channel))[channel.encode()])
        finally:
            client.close()
    return counts


def test_rediss_nodes_with_certificate_checks_lock_fence_wait_and_release(tls_masters):
    masters, ports, certs = tls_masters
    engine = Redlock([rediss(p, certs["ca.crt"]) for p in ports], node_timeout=0.5, retry_delay=3)
    try:
        with engine.lock("job", ttl=5) as lock:
            assert len(tokens_on(masters, lock.key)) == 1  # seen through the plain port
            assert lock.extend() > 4
            assert lock.fence >= 1
        assert tokens_on(masters, engine.lock_key("job")) == set()

        # Woken by a notice over TLS, not after the 1.5-3 s blind retry.
        assert hand_off_time(engine, "job", settle=0.5) < 1.45
        # Over TLS, on every master: the waiter was handed the lock on a quorum's word, and a
        # loaded machine may still be in the last inbox's TLS handshake then.
        subscribed = lambda: subscribers(masters, engine.notices.inbox) == [1, 1, 1]  # noqa: E731
        assert wait_until(subscribed, 10), subscribers(masters, engine.notices.inbox)
    finally:
        engine.close()  # stops the notice listeners: no TLS reconnects once the masters stop
    assert wait_until(lambda: subscribers(masters, engine.notices.inbox) == [0, 0, 0], 3.0)


def test_rediss_refuses_a_server_certificate_from_another_ca(tls_masters, tmp_path):
    masters, ports, _ = tls_masters
    stranger = make_certificates(tmp_path / "other", "stranger")
    engine = Redlock([rediss(p, stranger["ca.crt"]) for p in ports], node_timeout=0.5)
    try:
        with pytest.raises(QuorumUnavailable) as caught:
            engine.lock("job", ttl=5).acquire()
    finally:
        engine.close()
    assert "certificate verify failed" in str(caught.value).lower()
    for m in masters:
        client = m.client()
        try:
            assert client.get(engine.lock_key("job")) is None  # nothing reached any master
        finally:
            client.close()
