"""Who reads the release notices (``notices.ReleaseNotices``): a waiting thread reads its own,
with no listener thread between the masters and it; a second waiting thread in the process is
woken by the reader and reads once the turn passes to it; asyncio waiters are read for by the
keeper thread, which gives the turn to a waiting thread; a master that comes back is subscribed
again; the connections close once the inbox stops lingering. Each check measures a hand-off
against the safety poll it would otherwise wait for: a missed notice would cost 30 s here."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from django_redlock.engine import Redlock
from django_redlock.engine.algorithm import procedures
from django_redlock.engine.waiting import notices
from django_redlock.engine.waiting.notices import ReleaseNotices

from .conftest import wait_until

#: Far above a hand-off (a few ms) and far below the safety poll the tests put off to 30 s.
PROMPT = 2.0


@pytest.fixture(autouse=True)
def no_safety_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a notice can wake a waiter within the tests' time (see ``conftest.hand_off_time``)."""
    monkeypatch.setattr(procedures, "SAFETY_POLL", 30.0)


@pytest.fixture
def readers(monkeypatch: pytest.MonkeyPatch) -> dict[str, set[int]]:
    """The threads (idents) that delivered each waiter's notices, by the waiter's id: recorded
    around ``deliver``, which still delivers."""
    seen: dict[str, set[int]] = {}
    deliver = ReleaseNotices.deliver

    def recording(hub: ReleaseNotices, notice: bytes, inbox: object) -> None:
        named = notice.split(b" ")[1].decode()
        seen.setdefault(named, set()).add(threading.get_ident())
        deliver(hub, notice, inbox)  # type: ignore[arg-type]

    monkeypatch.setattr(ReleaseNotices, "deliver", recording)
    return seen


def queued(masters, resource: str) -> list[int]:
    return [m.call("ZCARD", f"redlock:queue:{resource}") for m in masters]


@contextmanager
def waiting_thread(engine: Redlock, resource: str) -> Iterator[dict]:
    """A thread that waits for ``resource`` and releases it at once; the dict tells its ident,
    when it got the lock (monotonic) or its error."""
    seen: dict = {}

    def run() -> None:
        seen["ident"] = threading.get_ident()
        try:
            with engine.lock(resource, ttl=10, wait=20):
                seen["got"] = time.monotonic()
        except Exception as exc:  # noqa: BLE001 (the test reads it)
            seen["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        yield seen
    finally:
        thread.join(25)


def hand_over(lock, masters, resource: str, seen: dict) -> float:
    """Release ``lock`` once the waiter is queued on every master; seconds until it held it."""
    assert wait_until(lambda: queued(masters, resource) == [1] * len(masters), 5.0)
    released = time.monotonic()
    lock.release()
    assert wait_until(lambda: "got" in seen or "error" in seen, 10.0), seen
    assert "got" in seen, seen
    return seen["got"] - released


def notice_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("redlock-notices")]


def test_a_waiting_thread_reads_its_own_notices(fresh_masters, redlock_of, readers):
    """No thread between the masters and the waiter: the notices that wake it are read and
    delivered on its own thread (the process has one keeper thread, which never read them)."""
    masters = fresh_masters(3)
    holder, engine = redlock_of(masters), redlock_of(masters)
    before = set(notice_threads())
    lock = holder.lock("hot", ttl=10).acquire()
    with waiting_thread(engine, "hot") as seen:
        assert len(set(notice_threads()) - before) == 1 or wait_until(
            lambda: len(set(notice_threads()) - before) == 1, 2.0
        )
        assert hand_over(lock, masters, "hot", seen) < PROMPT
    assert readers, "no notice was delivered"
    assert set().union(*readers.values()) == {seen["ident"]}


def test_a_second_waiting_thread_is_woken_and_then_reads(fresh_masters, redlock_of, readers):
    """Two threads of one process wait for two resources: one reads for both, the other sleeps
    until the reader wakes it. Released in both orders, each is woken promptly, and the one that
    waits longer reads for itself once the other left (the turn passed to it)."""
    masters = fresh_masters(3)
    holder, engine = redlock_of(masters), redlock_of(masters)
    for first, second in (("x", "y"), ("y", "x")):
        readers.clear()
        locks = {r: holder.lock(f"{r}-{first}", ttl=10).acquire() for r in ("x", "y")}
        with waiting_thread(engine, f"x-{first}") as x, waiting_thread(engine, f"y-{first}") as y:
            by = {"x": x, "y": y}
            assert hand_over(locks[first], masters, f"{first}-{first}", by[first]) < PROMPT
            assert hand_over(locks[second], masters, f"{second}-{first}", by[second]) < PROMPT
        # The second's notices (the release that handed it the lock) came after the first
        # waiter had gone: only its own thread was left to read them. The first's were read by
        # whichever of the two read then.
        assert {by[second]["ident"]} in readers.values(), (readers, by)
        assert set().union(*readers.values()) <= {x["ident"], y["ident"]}


def test_a_waiter_handed_the_lock_takes_it_in_one_wake_up(fresh_masters, redlock_of, monkeypatch):
    """Released, a lock is handed to the waiter on all five masters: its reader reads on from
    the first master's word to a quorum's within the wait already under way (no second wait
    for the rest), and stops there: the two other words wait in their sockets. (Before, the
    wait returned at the first word, and the waiter asked again for the others in about half
    of the hand-offs on a busy machine.)"""
    masters = fresh_masters(5)
    # (A generous node budget: the reader reads on for at most that long after the first word.)
    holder, engine = redlock_of(masters), redlock_of(masters, node_timeout=1.0)
    waits: list[float] = []  # when each wait for a notice began (monotonic)
    words: list[tuple[float, int]] = []  # when each word was delivered, and on which thread
    wait_notice, deliver = ReleaseNotices.wait_notice, ReleaseNotices.deliver

    def counted_wait(hub: ReleaseNotices, waiter: object, timeout: float, budget: float) -> bool:
        waits.append(time.monotonic())
        return wait_notice(hub, waiter, timeout, budget)  # type: ignore[arg-type]

    def counted_word(hub: ReleaseNotices, notice: bytes, inbox: object) -> None:
        words.append((time.monotonic(), threading.get_ident()))
        deliver(hub, notice, inbox)  # type: ignore[arg-type]

    monkeypatch.setattr(ReleaseNotices, "wait_notice", counted_wait)
    monkeypatch.setattr(ReleaseNotices, "deliver", counted_word)
    lock = holder.lock("hot", ttl=10).acquire()
    with waiting_thread(engine, "hot") as seen:
        assert wait_until(lambda: queued(masters, "hot") == [1] * 5, 5.0)
        assert wait_until(lambda: engine.notices.heard_everywhere() and bool(waits), 5.0)
        released = time.monotonic()
        lock.release()
        assert wait_until(lambda: "got" in seen or "error" in seen, 10.0), seen
    assert "got" in seen, seen
    assert [w for w in waits if w >= released] == [], "a second wait for the rest of the words"
    after = [ident for at, ident in words if released <= at <= seen["got"]]
    assert after == [seen["ident"]] * 3, after  # a quorum's, on its own thread; no more


def test_words_that_are_not_notices_are_dropped_and_the_waiter_still_hears(
    fresh_masters, redlock_of
):
    """Anyone may PUBLISH on a process's inbox channel: a message that is not a notice (no
    space, empty) is dropped by the reader, which reads on; the waiter is still handed the
    lock promptly."""
    masters = fresh_masters(3)
    holder, engine = redlock_of(masters), redlock_of(masters)
    lock = holder.lock("hot", ttl=10).acquire()
    with waiting_thread(engine, "hot") as seen:
        assert wait_until(lambda: queued(masters, "hot") == [1, 1, 1], 5.0)
        assert wait_until(lambda: engine.notices.heard_everywhere(), 5.0)
        for m in masters:
            for junk in ("nospace", ""):
                assert m.call("PUBLISH", engine.notices.inbox, junk) == 1
        time.sleep(0.2)  # (read by the waiting thread meanwhile)
        assert "error" not in seen, seen
        assert hand_over(lock, masters, "hot", seen) < PROMPT


def test_the_keeper_reads_for_asyncio_and_gives_the_turn_to_a_thread(
    fresh_masters, redlock_of, readers
):
    """An asyncio waiter alone: the keeper reads for it (the loop's thread never blocks). A
    waiting thread beside it takes the turn from the keeper and reads its own notices."""
    masters = fresh_masters(3)
    holder, engine = redlock_of(masters), redlock_of(masters)
    a_lock = holder.lock("a", ttl=10).acquire()
    t_lock = holder.lock("t", ttl=10).acquire()
    got: dict = {}

    async def wait_async() -> None:
        got["loop ident"] = threading.get_ident()
        async with engine.lock("a", ttl=10, wait=20):
            got["got"] = time.monotonic()

    loop_thread = threading.Thread(target=asyncio.run, args=(wait_async(),))
    loop_thread.start()
    try:
        with waiting_thread(engine, "t") as seen:
            assert hand_over(t_lock, masters, "t", seen) < PROMPT
            assert hand_over(a_lock, masters, "a", got) < PROMPT
    finally:
        loop_thread.join(25)
    thread_ids = {named for named, idents in readers.items() if seen["ident"] in idents}
    assert thread_ids, "the waiting thread read none of its notices"
    keeper = {t.ident for t in notice_threads()}
    async_readers = set().union(*(readers[n] for n in readers if n not in thread_ids))
    assert async_readers, "no notice of the asyncio waiter was delivered"
    assert async_readers <= keeper, (async_readers, keeper)
    assert got["loop ident"] not in async_readers


def subscribers(masters, engine: Redlock) -> list[int]:
    return [
        dict(m.client().pubsub_numsub(engine.notices.inbox))[engine.notices.inbox.encode()]
        for m in masters
    ]


def test_a_restarted_master_is_subscribed_again(fresh_masters, redlock_of):
    """A master that restarts while a thread waits drops our inbox connection: the keeper
    connects again (after ``RECONNECT``), and that master's notices count again."""
    masters = fresh_masters(3)
    holder, engine = redlock_of(masters), redlock_of(masters)
    lock = holder.lock("hot", ttl=10).acquire()
    with waiting_thread(engine, "hot") as seen:
        assert wait_until(lambda: subscribers(masters, engine) == [1, 1, 1], 5.0)
        masters[2].restart()
        assert wait_until(lambda: subscribers(masters, engine) == [1, 1, 1], 5.0)
        assert wait_until(lambda: engine.notices.heard_everywhere(), 5.0)
        # (The restarted master forgot the lock and the queue: the two others hand it over.)
        assert hand_over_on(lock, masters[:2], seen) < PROMPT


def hand_over_on(lock, masters, seen: dict) -> float:
    assert wait_until(lambda: queued(masters, "hot") == [1] * len(masters), 5.0)
    released = time.monotonic()
    lock.release()
    assert wait_until(lambda: "got" in seen or "error" in seen, 10.0), seen
    assert "got" in seen, seen
    return seen["got"] - released


def test_the_inbox_closes_once_it_stops_lingering(fresh_masters, redlock_of, monkeypatch):
    """After the last waiter, the inbox stays subscribed for ``LINGER`` (a hot lock's next wait
    pays no SUBSCRIBE), then its connections close."""
    monkeypatch.setattr(notices, "LINGER", 0.5)
    masters = fresh_masters(3)
    holder, engine = redlock_of(masters), redlock_of(masters)
    lock = holder.lock("hot", ttl=10).acquire()
    with waiting_thread(engine, "hot") as seen:
        assert hand_over(lock, masters, "hot", seen) < PROMPT
    assert subscribers(masters, engine) == [1, 1, 1]  # lingering
    assert wait_until(lambda: subscribers(masters, engine) == [0, 0, 0], 5.0)


def test_a_forked_child_reads_its_own_inbox(fresh_masters, redlock_of):
    """A child forked after its parent waited (a prefork worker: the parent's keeper thread and
    inbox connections exist) waits with an inbox, a keeper and connections of its own, and a
    release wakes it promptly."""
    masters = fresh_masters(3)
    holder, engine = redlock_of(masters), redlock_of(masters)
    warm = holder.lock("warm", ttl=10).acquire()
    with waiting_thread(engine, "warm") as seen:
        assert hand_over(warm, masters, "warm", seen) < PROMPT  # the parent waited once
    parent_inbox = engine.notices.inbox
    lock = holder.lock("hot", ttl=10).acquire()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait, report, leave at once (no test teardown here)
        status = 1
        try:
            with engine.lock("hot", ttl=10, wait=20):
                report = {"got": time.monotonic(), "inbox": engine.notices.inbox}
            os.write(write, json.dumps(report).encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    try:
        assert wait_until(lambda: queued(masters, "hot") == [1, 1, 1], 10.0)
        released = time.monotonic()
        lock.release()
        with os.fdopen(read) as child:
            report = json.loads(child.read() or "{}")
    finally:
        _, status = os.waitpid(pid, 0)
    assert status == 0, status
    assert report["inbox"] != parent_inbox
    assert report["got"] - released < PROMPT
