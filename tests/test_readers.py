"""``shared=True``: readers share, the writer (the plain lock on the same name) excludes everyone,
a waiting writer stops new readers; each reader is an ordinary lease. Real masters."""

from __future__ import annotations

import contextlib
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
from django_redlock.engine import LockContended, LockLost, Redlock, protocol
from django_redlock.testing.proxy import DelayProxy


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


def test_a_waiting_writer_stops_new_readers_and_gets_in_when_the_last_leaves(masters, redlock_of):
    engine = redlock_of(masters, retry_delay=5.0)
    reader = engine.lock("menu", shared=True, ttl=10).acquire()
    writer_in: list[float] = []

    def writer() -> None:
        with engine.lock("menu", ttl=10, wait=10):
            writer_in.append(time.monotonic())

    thread = threading.Thread(target=writer)
    thread.start()
    time.sleep(0.4)  # the writer lost once and queued
    with pytest.raises(LockContended, match="a writer waits"):
        engine.lock("menu", shared=True).acquire()
    left = time.monotonic()
    reader.release()
    thread.join(10)
    assert writer_in
    assert writer_in[0] - left < 0.6  # woken by the last reader out, not a poll


def test_the_last_reader_wakes_the_writer_even_behind_a_queued_reader(masters, redlock_of):
    """A reader with a shorter wait queues ahead of the waiting writer (and cannot enter while
    the writer waits): the last reader out must wake the writer, not that reader."""
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
    time.sleep(0.4)  # the writer queued
    threads.append(threading.Thread(target=late_reader))
    threads[1].start()
    # The reader queued, ahead of the writer (its deadline is sooner); and the writer's safety
    # poll (every second) just went by, so that only a notice can wake it within half a second.
    time.sleep(0.7)
    left = time.monotonic()
    reader.release()
    for thread in threads:
        thread.join(10)
    assert writer_in
    assert writer_in[0] - left < 0.5


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
    assert max(waits) < 0.8, waits


def test_readers_queued_behind_a_writer_all_get_in_when_it_leaves(masters, redlock_of):
    engine = redlock_of(masters, retry_delay=5.0)
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
    time.sleep(0.4)
    left = time.monotonic()
    writer.release()
    for thread in threads:
        thread.join(10)
    assert len(entered) == 3
    assert max(entered) - left < 0.8


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
