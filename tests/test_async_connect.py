"""An event loop's connections to plain TCP masters named by address are made on the loop itself
(``engine.dialing``): no thread, also when a master is down (refused at once) and when the
handshake authenticates and selects a database; a thread's, lock path and notice inbox alike,
with a plain socket, not redis-py's connect. Each case runs in a fresh process: the connect
thread pool is process-wide, and an earlier test of this one may have started it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import redis

from django_redlock.testing.masters import LocalMaster

#: Runs in a fresh process: async acquire+release on URLS, then reports whether the connect
#: thread pool was ever made, the threads alive, and what the masters hold.
PROBE = textwrap.dedent(
    """
    import asyncio, json, sys, threading
    from django_redlock.engine import Redlock
    from django_redlock.engine.members import dialing

    urls, keep = json.loads(sys.argv[1]), sys.argv[2:] == ["keep"]

    async def main():
        engine = Redlock(urls, node_timeout=0.5)
        try:
            lock = engine.lock("dial", ttl=30)
            await lock.aacquire()
            held = lock.held
            if not keep:
                await lock.arelease()
            return held
        finally:
            engine.close()

    held = asyncio.run(main())
    print(json.dumps({
        "held": held,
        "pool": dialing._pool is not None,
        "threads": sorted(t.name for t in threading.enumerate()),
    }))
    """
)


def probe(urls: list[str], *keep: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(urls), *keep],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def add_dialer(group: list[LocalMaster], default_password: str | None = None) -> None:
    """A user "dialer" (password "pw") on each master of ``group``."""
    for m in group:
        client = m.client()
        try:
            client.execute_command("ACL", "SETUSER", "dialer", "reset", "on", ">pw", "~*", "&*")
            client.execute_command("ACL", "SETUSER", "dialer", "+@all")
            if default_password is not None:
                client.config_set("requirepass", default_password)
        finally:
            client.close()


def test_an_async_connect_to_an_address_starts_no_thread(masters: list[LocalMaster]) -> None:
    seen = probe([m.url for m in masters])
    assert seen["held"] is True
    assert seen["pool"] is False, seen
    assert not [t for t in seen["threads"] if "connect" in t], seen  # type: ignore[attr-defined]


def test_a_master_that_is_down_is_refused_on_the_loop(fresh_masters) -> None:
    group = fresh_masters(3)
    group[2].kill()
    seen = probe([m.url for m in group])
    assert seen["held"] is True  # 2 of 3: a quorum
    assert seen["pool"] is False, seen


def test_the_handshake_authenticates_and_selects_on_the_loop(fresh_masters) -> None:
    group = fresh_masters(3)
    add_dialer(group, default_password="pw2")  # the default user: a password alone
    with_user = [f"redis://dialer:pw@127.0.0.1:{m.port}/3" for m in group]
    seen = probe(with_user, "keep")  # the lock stays held (30 s): where is its key?
    assert seen["held"] is True
    assert seen["pool"] is False, seen
    for m in group:
        for db, keys in ((0, 0), (3, 1)):  # in the URL's db only
            client = redis.Redis(host="127.0.0.1", port=m.port, password="pw2", db=db)
            try:
                assert client.exists("redlock:lock:dial") == keys, (m.port, db)
            finally:
                client.close()
    password_only = [f"redis://:pw2@127.0.0.1:{m.port}/2" for m in group]
    assert probe(password_only)["held"] is True
    # A wrong password fails the member, as the thread pool's connect did: no quorum.
    wrong = [f"redis://dialer:nope@127.0.0.1:{m.port}/3" for m in group]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(wrong)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "QuorumUnavailable" in done.stderr, done.stderr[-2000:]
    assert "WRONGPASS" in done.stderr or "Invalid" in done.stderr or "auth" in done.stderr.lower()


#: Runs in a fresh process: a thread holds "dial" on URLS while another engine's thread waits for
#: it (so its notice inbox connects too), then reports redis-py's connects and what it got.
THREADS_PROBE = textwrap.dedent(
    """
    import json, sys, threading
    import redis
    from django_redlock.engine import Redlock

    connects = []
    connect = redis.connection.AbstractConnection.connect
    def counted(self, *args, **kwargs):
        connects.append(type(self).__name__)
        return connect(self, *args, **kwargs)
    redis.connection.AbstractConnection.connect = counted

    urls = json.loads(sys.argv[1])
    holder, waiter = Redlock(urls, node_timeout=0.5), Redlock(urls, node_timeout=0.5)
    try:
        lock = holder.lock("dial", ttl=30).acquire()
        got = []
        def wait():
            with waiter.lock("dial", ttl=30, wait=10):
                got.append(True)
        thread = threading.Thread(target=wait)
        thread.start()
        while not waiter.notices.heard_everywhere():
            threading.Event().wait(0.01)
        lock.release()
        thread.join(10)
    finally:
        holder.close()
        waiter.close()
    print(json.dumps({"got": got, "connects": connects}))
    """
)


def test_a_threads_connects_to_an_address_are_plain_sockets(fresh_masters) -> None:
    """The lock path's pipes and the notice inbox: each a socket, a connect() and (AUTH, SELECT)
    one write, as on the loop; redis-py's connect costs ~5x the CPU, ten times in a fresh
    process's first wait. The handshake's failure still fails the member."""
    group = fresh_masters(3)
    add_dialer(group)

    def run(urls: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", THREADS_PROBE, json.dumps(urls)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = run([f"redis://dialer:pw@127.0.0.1:{m.port}/3" for m in group])
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {"got": [True], "connects": []}, seen
    wrong = run([f"redis://dialer:nope@127.0.0.1:{m.port}/3" for m in group])
    assert wrong.returncode != 0
    assert "QuorumUnavailable" in wrong.stderr, wrong.stderr[-2000:]
    assert "WRONGPASS" in wrong.stderr or "auth" in wrong.stderr.lower(), wrong.stderr[-2000:]
