"""``shared=True``: readers share, the writer (the plain lock on the same name) excludes everyone,
a waiting writer stops new readers; each reader is an ordinary lease. Real masters."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time

import pytest

from bench.chaos.permits import (
    Stretch,
    beside_writer,
    engine_section,
    partitioned_apart,
    run,
)
from django_redlock.engine import LockContended, LockLost, Redlock
from django_redlock.engine.algorithm import procedures
from django_redlock.engine.base import protocol
from django_redlock.testing.proxy import DelayProxy
from tests.conftest import wait_until


def test_readers_share_and_exclude_the_writer(masters, redlock_of):
    engine = redlock_of(masters)
    with engine.lock("prices", shared=True, ttl=5) as a, engine.lock("prices", shared=True) as b:
        assert a.held
        assert b.held
        assert a.owned()
        assert a.extend(ttl=6) > 5
        with pytest.raises(LockContended, match="held by readers"):
            engine.lock("prices").acquire()
    with engine.lock("prices") as writer:
        assert writer.held
        with pytest.raises(LockContended, match="held by a writer"):
            engine.lock("prices", shared=True).acquire()
        with pytest.raises(LockContended):
            engine.lock("prices").acquire()
    with engine.lock("prices", shared=True) as again:
        assert again.held


def no_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Put every waiter's polls off past the test (a writer's, and a reader's: it sleeps in
    ``wait_turn`` with its default bound, fixed when ``procedures`` was loaded), so that only a
    notice can wake a waiter, and a bound on its wake-up can leave a loaded machine seconds."""
    monkeypatch.setattr(procedures, "SAFETY_POLL", 30.0)
    monkeypatch.setattr(procedures, "UNHEARD_POLL", 30.0)
    monkeypatch.setattr(procedures.wait_turn, "__defaults__", (30.0,))


def queued(masters, name: str, count: int) -> bool:
    """Whether ``name``'s waiter queue holds ``count`` entries on every master."""
    return all(m.call("ZCARD", f"redlock:queue:{name}") == count for m in masters)


def test_a_waiting_writer_stops_new_readers_and_gets_in_when_the_last_leaves(
    masters, redlock_of, monkeypatch
):
    no_polls(monkeypatch)
    engine = redlock_of(masters, retry_delay=5.0)
    reader = engine.lock("menu", shared=True, ttl=10).acquire()
    writer_in: list[float] = []

    def writer() -> None:
        with engine.lock("menu", ttl=10, wait=10):
            writer_in.append(time.monotonic())

    thread = threading.Thread(target=writer)
    thread.start()
    assert wait_until(lambda: queued(masters, "menu", 1), 10)  # the writer lost once and queued
    with pytest.raises(LockContended, match="a writer waits"):
        engine.lock("menu", shared=True).acquire()
    left = time.monotonic()
    reader.release()
    thread.join(10)
    assert writer_in
    assert writer_in[0] - left < 2.0  # woken by the last reader out (no poll, 5 s retries)


def test_the_last_reader_wakes_the_writer_even_behind_a_queued_reader(
    masters, redlock_of, monkeypatch
):
    """A reader with a shorter wait queues ahead of the waiting writer (and cannot enter while
    the writer waits): the last reader out must wake the writer, not that reader."""
    no_polls(monkeypatch)
    engine = redlock_of(masters, retry_delay=5.0)
    reader = engine.lock("feed", shared=True, ttl=10).acquire()
    writer_in: list[float] = []

    def writer() -> None:
        with engine.lock("feed", ttl=10, wait=10):
            writer_in.append(time.monotonic())
            time.sleep(0.2)

    def late_reader() -> None:
        with contextlib.suppress(LockContended), engine.lock("feed", shared=True, wait=3):
            pass

    threads = [threading.Thread(target=writer)]
    threads[0].start()
    assert wait_until(lambda: queued(masters, "feed", 1), 10)  # the writer queued
    threads.append(threading.Thread(target=late_reader))
    threads[1].start()
    # The reader queued, ahead of the writer (its deadline is sooner); no poll: only a notice
    # can wake the writer.
    assert wait_until(lambda: queued(masters, "feed", 2), 10)
    left = time.monotonic()
    reader.release()
    for thread in threads:
        thread.join(10)
    assert writer_in
    assert writer_in[0] - left < 2.0


def queue_on_every_master(masters, name: str) -> list[tuple[list[str], set[str]]]:
    """Each master's waiter queue of ``name`` (entries in order) and its queued readers."""
    found = []
    for m in masters:
        queue = [e.decode() for e in m.call("ZRANGE", f"redlock:queue:{name}", 0, -1)]
        reading = {e.decode() for e in m.call("SMEMBERS", f"redlock:readwait:{name}")}
        found.append((queue, reading))
    return found


def reader_then_writer_queued(masters, name: str) -> bool:
    """On every master: a reader first in the queue, then a writer, and the writer's process
    subscribed to its inbox there (so that a notice to it cannot be missed)."""
    for m, (queue, reading) in zip(masters, queue_on_every_master(masters, name), strict=True):
        if len(queue) != 2 or queue[0] not in reading or queue[1] in reading:
            return False
        inbox = "redlock:wake:" + queue[1].partition(".")[0]
        if m.call("PUBSUB", "NUMSUB", inbox)[1] < 1:
            return False
    return True


def test_a_writer_queued_behind_a_reader_is_woken_when_the_writer_before_it_leaves(
    masters, redlock_of, monkeypatch
):
    """W1 writes; reader R queues, then writer W2. W1's release wakes R, the head of the queue;
    R is refused (a writer waits), and must pass the wake-up on to W2, which would otherwise
    sleep until its safety poll with the name free. The writer's polls are put off to 30 s here,
    so only a notice can let it in within the 10 s allowed (before the fix: at its poll, 30 s)."""
    monkeypatch.setattr(procedures, "SAFETY_POLL", 30.0)
    monkeypatch.setattr(procedures, "UNHEARD_POLL", 30.0)
    engine = redlock_of(masters)
    name = "relay"
    w1 = engine.lock(name, ttl=60).acquire()
    w2_in = threading.Event()
    r_in = threading.Event()
    w2_may_leave = threading.Event()

    def reader() -> None:
        with engine.lock(name, shared=True, ttl=10, wait=40):
            r_in.set()

    def writer() -> None:
        with engine.lock(name, ttl=10, wait=60):
            w2_in.set()
            w2_may_leave.wait(10)

    threads = [threading.Thread(target=reader)]
    threads[0].start()
    assert wait_until(lambda: all(q for q, _ in queue_on_every_master(masters, name)), 10)
    threads.append(threading.Thread(target=writer))
    threads[1].start()
    try:
        assert wait_until(lambda: reader_then_writer_queued(masters, name), 10)
        w1.release()
        assert w2_in.wait(10), "the writer behind the reader was not woken"
        assert not r_in.is_set()  # the writer went first: the reader still waits
        w2_may_leave.set()
        assert r_in.wait(10), "the reader was not let in after the writer"
    finally:
        w2_may_leave.set()
        for thread in threads:
            thread.join(60)


def test_each_refused_attempt_of_a_reader_tells_the_waiting_writer_anew(masters, redlock_of):
    """A reader refused for a queued writer while the name is free tells the writer each time,
    with a notice of its own per attempt: a writer woken again by the same reader (a second
    release woke that reader first again) must not take the word for one it already acted on
    (``notice_reading.deliver`` acts once per notice)."""
    engine = redlock_of(masters)
    name = "told"
    writer = "0123456789ab.0"  # a writer queued from a process whose inbox we listen to
    for m in masters:  # (as the writer's script queues it: the queue lasts as its wait)
        entry = f"{writer} 5000 {'0' * 32}:{{}}"
        m.call("ZADD", f"redlock:queue:{name}", int(time.time() * 1000) + 60_000, entry)
        m.call("PEXPIRE", f"redlock:queue:{name}", 60_000)
    inbox = masters[0].client().pubsub()
    inbox.subscribe("redlock:wake:0123456789ab")
    assert wait_until(lambda: inbox.get_message(timeout=0.1), 5)  # (the subscription's)
    with pytest.raises(LockContended, match="a writer waits"):
        engine.lock(name, shared=True, wait=1.5).acquire()
    told = set()
    while (message := inbox.get_message(timeout=0.5)) is not None:
        digest, named = message["data"].decode().split(" ")
        assert named == writer
        told.add(digest)
    inbox.close()
    assert len(told) >= 2, told  # one notice per attempt (at least two attempts in 1.5 s)


#: A child process that takes ``sys.argv[2]`` on the masters ``sys.argv[3:]`` as a writer or a
#: reader (``sys.argv[1]``), says "in" once it holds it, and leaves when told (a line on stdin).
#: Its polls are put off to 30 s: only a notice can wake it sooner.
_WAITER = """
import sys
from django_redlock.engine import Redlock
from django_redlock.engine.algorithm import procedures
procedures.SAFETY_POLL = procedures.UNHEARD_POLL = 30.0
kind, name, urls = sys.argv[1], sys.argv[2], sys.argv[3:]
engine = Redlock(urls)
if kind == "reader":
    lock = engine.lock(name, shared=True, ttl=10, wait=40)
else:
    lock = engine.lock(name, ttl=10, wait=60)
with lock:
    print("in", flush=True)
    sys.stdin.readline()
engine.close()
"""


def test_a_writer_behind_a_reader_is_woken_across_processes(masters, redlock_of):
    """As above, with W1, R and W2 in three processes: the wake-up is passed on by the masters
    (the refused reader's script), not by anything its process shares with the writer's."""
    engine = redlock_of(masters)
    name = "relay-processes"
    w1 = engine.lock(name, ttl=60).acquire()
    urls = [m.url for m in masters]

    def child(kind: str) -> subprocess.Popen[str]:
        return subprocess.Popen(  # noqa: S603
            [sys.executable, "-c", _WAITER, kind, name, *urls],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def holds(pid: int) -> bool:
        values = [m.call("GET", f"redlock:lock:{name}") or b"" for m in masters]
        return sum(f'"pid":{pid},'.encode() in v for v in values) > len(masters) // 2

    with contextlib.ExitStack() as stack:
        reader = stack.enter_context(child("reader"))
        stack.callback(reader.kill)
        assert wait_until(lambda: all(q for q, _ in queue_on_every_master(masters, name)), 20)
        writer = stack.enter_context(child("writer"))
        stack.callback(writer.kill)
        assert wait_until(lambda: reader_then_writer_queued(masters, name), 20)
        w1.release()
        assert wait_until(lambda: holds(writer.pid), 10), "the writer was not woken"
        assert reader.poll() is None  # still waiting, behind the writer
        assert writer.stdin is not None
        assert reader.stdout is not None
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.wait(10) == 0
        assert reader.stdout.readline() == "in\n"  # let in once the writer left


def test_a_writer_is_not_starved_by_a_stream_of_readers(masters, redlock_of):
    """Six threads read without pause (each read 20 ms); a writer still gets in, five times,
    each within a bounded wait: readers step aside for it until it has won on every master."""
    engine = redlock_of(masters)
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            with contextlib.suppress(LockContended), engine.lock("stream", shared=True, wait=5):
                time.sleep(0.02)

    readers = [threading.Thread(target=reader) for _ in range(6)]
    for thread in readers:
        thread.start()
    waits = []
    try:
        time.sleep(0.2)
        for _ in range(5):
            asked = time.monotonic()
            with engine.lock("stream", wait=10):
                waits.append(time.monotonic() - asked)
            time.sleep(0.05)
    finally:
        stop.set()
        for thread in readers:
            thread.join(10)
    assert len(waits) == 5
    # Bounded (2 s: a loaded machine's slack): starved, it would wait up to its 10 s or fail.
    assert max(waits) < 2.0, waits


def test_readers_queued_behind_a_writer_all_get_in_when_it_leaves(masters, redlock_of, monkeypatch):
    no_polls(monkeypatch)
    engine = redlock_of(masters, retry_delay=5.0)
    joined: list[object] = []  # the readers in line in this process (the first on the masters)
    join = engine.queues.join
    monkeypatch.setattr(
        engine.queues, "join", lambda resources: joined.append(1) or join(resources)
    )
    writer = engine.lock("board", ttl=10).acquire()
    inside = threading.Barrier(3, timeout=5)
    entered: list[float] = []

    def reader() -> None:
        with engine.lock("board", shared=True, ttl=10, wait=10):
            entered.append(time.monotonic())
            inside.wait()  # all three at once: they share

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    assert wait_until(lambda: len(joined) == 3 and queued(masters, "board", 1), 10)
    left = time.monotonic()
    writer.release()
    for thread in threads:
        thread.join(10)
    assert len(entered) == 3
    assert max(entered) - left < 2.0  # woken by the writer's release (no poll, 5 s retries)


def test_a_reader_taken_away_is_lost(masters, redlock_of):
    engine = redlock_of(masters)
    reader = engine.lock("ledger", shared=True, ttl=5).acquire()
    for m in masters:
        for key in m.client().scan_iter(match=b"redlock:lock:ledger@reader:*"):
            m.call("DEL", key)
    assert not reader.owned()
    assert reader.lost
    with pytest.raises(LockLost):
        reader.release()


def test_bad_combinations_are_refused(masters, redlock_of):
    engine = redlock_of(masters)
    with pytest.raises(ValueError, match="shared=True with reentrant=True"):
        engine.lock("x", shared=True, reentrant=True)
    with pytest.raises(ValueError, match="shared=True with several resources"):
        engine.lock("x", "y", shared=True)


def readers_and_a_writer_apart(masters, name: str) -> list[Stretch]:
    """One writer and four readers, each client cut off from a different pair of masters, five
    sections each; what they recorded."""
    views = [[DelayProxy(m.port).start() for m in masters] for _ in range(5)]
    engines = [Redlock([p.url for p in view], node_timeout=0.03) for view in views]
    try:
        sections = [
            engine_section(e, name, 0.1, "writer", ttl=2.0, wait=3.0)
            if i == 0
            else engine_section(e, name, 0.1, "reader", ttl=2.0, wait=3.0, shared=True)
            for i, e in enumerate(engines)
        ]
        return run(sections, 5, partitioned_apart(views))
    finally:
        closing = [threading.Thread(target=e.close) for e in engines]
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join()
        for view in views:
            for proxy in view:
                proxy.stop()


@pytest.mark.slow
def test_no_reader_beside_a_writer_under_a_partition(masters):
    """The chaos check "never a reader beside a writer", with the majority quorum."""
    recorded = readers_and_a_writer_apart(masters, "rw")
    assert {s.kind for s in recorded} == {"reader", "writer"}
    assert beside_writer(recorded) == []


@pytest.mark.slow
def test_the_reader_check_trips_on_a_quorum_of_one(masters, monkeypatch):
    """The check's self-test: with a quorum of 1 (patched in this test only), a reader gets in
    beside the writer under the same partition."""
    monkeypatch.setattr(protocol, "quorum", lambda node_count: 1)
    recorded = readers_and_a_writer_apart(masters, "rw1")
    assert beside_writer(recorded)


def test_the_writer_check_itself():
    w = Stretch("writer", 1.0, 9.0, 2.0)
    assert beside_writer([Stretch("reader", 0.0, 9.0, 1.0), w]) == []  # touching
    r = Stretch("reader", 1.5, 9.0, 3.0)
    assert beside_writer([w, r]) == [(w, r)]
    assert beside_writer([Stretch("reader", 0.0, 9, 5), Stretch("reader", 1.0, 9, 6)]) == []
