"""A release hands the lock to the waiter at the head of the queue (``scripts.wake``), and that
waiter holds it once a quorum of masters told it so, without a round of its own
(``handoff.handed_over``): no barging, a hand-off of notice + wake-up, a validity that counts
from the waiter's queued attempt, and every way it can go wrong falling back to a round."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import redis

from django_redlock.engine import LockContended, Redlock
from django_redlock.engine.algorithm import holding, procedures
from django_redlock.engine.base.events import NullObserver
from django_redlock.testing.proxy import DelayProxy

from .conftest import wait_until

KEY = "redlock:lock:hot"
QUEUE = "redlock:queue:hot"
#: The waiters' node budget: also how long a waiter told by one master waits for a quorum's word
#: before it takes a round instead, which a loaded machine must not make it do here.
NEWS = 0.5


def values(masters) -> list[bytes | None]:
    return [m.call("GET", KEY) for m in masters]


def queued(masters) -> list[int]:
    return [m.call("ZCARD", QUEUE) for m in masters]


def settled(masters, *engines: Redlock) -> bool:
    """Each engine's waiter is queued on every master, and its inbox subscribed there (a release
    skips a waiter that no one hears)."""
    if queued(masters) != [len(engines)] * 5:
        return False
    inboxes = [e.notices.inbox for e in engines]
    return all(count == 1 for m in masters for _, count in m.client().pubsub_numsub(*inboxes))


def scripts_run(masters) -> list[int]:
    """Scripts each master ran so far (EVALSHA, or EVAL the first time a process sends one)."""
    return [m.commands_run("eval", "evalsha") for m in masters]


@contextmanager
def waiting(
    engine: Redlock, *, ttl: float = 10, wait: float = 10, hold: float | threading.Event = 0.0
) -> Iterator[dict]:
    """A thread that waits for "hot" on ``engine``, holds it ``hold`` seconds (or until ``hold``
    is set), releases it. The
    dict tells what it saw: ``validity`` when it got the lock, ``got`` (monotonic), ``error``."""
    seen: dict = {}
    acquired = threading.Event()

    def run() -> None:
        lock = engine.lock("hot", ttl=ttl, wait=wait)
        try:
            lock.acquire()
        except Exception as exc:  # noqa: BLE001 (the test reads it)
            seen["error"] = exc
            return
        seen["got"], seen["validity"] = time.monotonic(), lock.validity
        acquired.set()
        if isinstance(hold, threading.Event):
            hold.wait(10)
        else:
            time.sleep(hold)
        seen["released"] = time.monotonic()
        lock.release()

    thread = threading.Thread(target=run, name="waiter")
    thread.start()
    seen["acquired"] = acquired
    try:
        yield seen
    finally:
        thread.join(wait + 5)


def test_a_release_hands_the_lock_to_the_queued_waiter_and_the_releaser_cannot_barge(
    masters, redlock_of
):
    """The waiter is far away (100 ms each way), the releaser near: the moment the release
    returned, the key already holds the waiter's value on the quorum that confirmed it (the
    release script set it), so the releaser, asking again at once, is refused, and the waiter
    gets the lock when the news reaches it. (Before, the key stayed free until the woken
    waiter's own round came, and the releaser took it back in between.)"""
    with contextlib.ExitStack() as stack:
        far = [stack.enter_context(DelayProxy(m.port)) for m in masters]
        engine, other = (
            redlock_of(masters),
            redlock_of([p.url for p in far], node_timeout=NEWS + 0.5),
        )
        holder = engine.lock("hot", ttl=10).acquire()
        with waiting(other, hold=0.5) as seen:
            assert wait_until(lambda: settled(masters, other), 5.0), queued(masters)
            for proxy in far:
                proxy.delay = 0.1
            holder.release()
            assert sum(value is not None for value in values(masters)) >= 3, values(masters)
            with pytest.raises(LockContended):
                engine.lock("hot", ttl=10, wait=0).acquire()
            assert seen["acquired"].wait(5.0), seen
        assert "error" not in seen


def test_a_handed_over_lock_takes_no_round_of_its_own(masters, redlock_of):
    """Between the release and the waiter holding, each master ran one script: the release
    (which handed the key over). The waiter's own acquire round is gone from the hand-off."""
    engine, other = redlock_of(masters), redlock_of(masters, node_timeout=NEWS)
    holder = engine.lock("hot", ttl=10).acquire()
    done = threading.Event()
    with waiting(other, hold=done) as seen:
        assert wait_until(lambda: settled(masters, other), 5.0), queued(masters)
        before = scripts_run(masters)
        holder.release()
        assert seen["acquired"].wait(5.0), seen

        def ran() -> list[int]:
            return [a - b for a, b in zip(scripts_run(masters), before, strict=True)]

        assert wait_until(lambda: ran() == [1] * 5, 5.0), ran()  # (the release returned at quorum)
        time.sleep(0.1)
        assert ran() == [1] * 5
        held = values(masters)
        done.set()
        assert held[0] is not None
        assert held == [held[0]] * 5  # the waiter's value, everywhere


class Attempts(NullObserver):
    """Keeps how many attempts each acquisition took."""

    def __init__(self) -> None:
        self.attempts: list[int] = []

    def acquired(self, lock, *, waited, attempts) -> None:  # type: ignore[no-untyped-def]
        self.attempts.append(attempts)


def test_a_releaser_asking_again_queues_behind_in_its_first_round(masters, redlock_of, monkeypatch):
    """Its release handed the lock on: asking again at once (a worker's loop), its first round
    is the one that queues it behind the new holder, not a plain SET that could only lose on
    every master that handed the lock on (a round for nothing on each master, on every
    hand-off of a hot lock). It gets the lock back when the new holder lets go, in one attempt.
    (The releaser's courtesy, the time it counts as "at once", is made 0.5 s here: a loaded
    machine may hold a thread back longer than the 3 ms of its default.)"""
    monkeypatch.setattr(holding, "COURTESY", 0.5)
    seen_by = Attempts()
    engine, other = redlock_of(masters, observer=seen_by), redlock_of(masters, node_timeout=NEWS)
    release_now, got_again, done = threading.Event(), threading.Event(), threading.Event()

    def worker() -> None:  # hold, release, and ask again at once
        lock = engine.lock("hot", ttl=10, wait=10)
        lock.acquire()
        release_now.wait(10)
        lock.release()
        with engine.lock("hot", ttl=10, wait=10):
            got_again.set()

    working = threading.Thread(target=worker)
    working.start()
    try:
        assert wait_until(lambda: None not in values(masters), 5.0), values(masters)
        with waiting(other, hold=done) as seen:
            assert wait_until(lambda: settled(masters, other), 5.0), queued(masters)
            release_now.set()
            assert seen["acquired"].wait(5.0), seen
            assert wait_until(lambda: queued(masters) == [1] * 5, 5.0), queued(masters)
            done.set()
            assert got_again.wait(5.0)
    finally:
        release_now.set()
        done.set()
        working.join(10)
    assert seen_by.attempts == [1, 1]  # the first acquisition's, then the one asked again


@pytest.mark.parametrize(
    ("ttl", "queued_for", "handed"),
    [(4.0, 1.0, True), (1.0, 0.7, False)],
    ids=["counted-from-the-queued-attempt", "too-little-left-so-a-round"],
)
def test_the_validity_of_a_hand_off(masters, redlock_of, ttl, queued_for, handed):
    """The masters set the waiter's lease when the release came, at some moment after its queued
    attempt began: only that moment is known, so the validity counts from it (here a second of
    a 4 s TTL is gone), and every master's key outlives it. Less than half its TTL would be left
    (0.7 s of 1 s gone): it takes a round instead (the keys hold its value: the round renews
    them), and gets a whole TTL."""
    engine, other = redlock_of(masters), redlock_of(masters, node_timeout=NEWS)
    holder = engine.lock("hot", ttl=10).acquire()
    with waiting(other, ttl=ttl, hold=0.3) as seen:
        assert wait_until(lambda: settled(masters, other), 5.0), queued(masters)
        time.sleep(queued_for)
        holder.release()
        assert seen["acquired"].wait(5.0), seen
        pttls = [m.call("PTTL", KEY) / 1000 for m in masters]
    if handed:
        assert seen["validity"] < ttl - queued_for, seen
    else:
        assert seen["validity"] > ttl - 0.2, seen
    assert min(pttls) > seen["validity"] - (time.monotonic() - seen["got"]), pttls


def test_a_waiter_that_gives_up_leaves_every_queue(masters, redlock_of):
    """Out of time while queued, a waiter leaves the masters' queues on its way out (with a
    release of our value, which passes on a key handed to it meanwhile): no release can hand the
    lock to it afterwards."""
    engine, other = redlock_of(masters), redlock_of(masters, node_timeout=NEWS)
    holder = engine.lock("hot", ttl=10).acquire()
    with waiting(other, wait=2.5) as seen:  # (long enough to be seen queued on a busy machine)
        assert wait_until(lambda: settled(masters, other), 5.0), queued(masters)
    assert isinstance(seen.get("error"), LockContended), seen
    assert queued(masters) == [0] * 5
    holder.release()
    assert values(masters) == [None] * 5


def test_a_release_hands_nothing_to_a_waiter_no_one_hears(masters, redlock_of):
    """A queued waiter whose process is gone (no subscriber on its inbox) is skipped: the key is
    not set to its value, and the next waiter gets the lock."""
    engine, other = redlock_of(masters), redlock_of(masters, node_timeout=NEWS)
    holder = engine.lock("hot", ttl=10).acquire()
    with waiting(other) as seen:
        assert wait_until(lambda: settled(masters, other), 5.0), queued(masters)
        ghost = "0badc0ffee00.0 10000 ghost-token"
        for m in masters:  # ahead of the live waiter (an earlier deadline), and not past it
            ((_, deadline),) = m.client().zrange(QUEUE, 0, 0, withscores=True)
            m.call("ZADD", QUEUE, int(deadline) - 1000, ghost)
        holder.release()
        assert seen["acquired"].wait(5.0), seen
        assert b"ghost-token" not in values(masters)


def test_a_hand_off_never_publishes_the_token(masters, redlock_of):
    """The notice that hands the lock over names the waiter and the hand-off, never the value
    that the queue entry carries (it holds the token)."""
    engine, other = redlock_of(masters), redlock_of(masters, node_timeout=NEWS)
    listener = redis.Redis.from_url(masters[0].url).pubsub()
    listener.psubscribe("*")
    holder = engine.lock("hot", ttl=10).acquire()
    with waiting(other, hold=0.3) as seen:
        assert wait_until(lambda: settled(masters, other), 5.0), queued(masters)
        holder.release()
        assert seen["acquired"].wait(5.0), seen
        token = values(masters)[0]
    heard = []
    while (message := listener.get_message(timeout=0.2)) is not None:
        if message["type"] == "pmessage":
            heard.append(message["data"])
    listener.close()
    assert token is not None
    assert any(data.endswith(b" +") for data in heard), heard
    assert not any(token in data or token.split(b":")[0] in data for data in heard), heard


def test_queues_that_disagree_split_the_hand_off_and_a_round_settles_it(
    masters, redlock_of, monkeypatch
):
    """Two waiters, queued first on different masters (B on 2, C on 3): each is handed the key
    where it is first; C, told by a quorum, holds the lock; B, told by two, takes a round one
    node budget after the release's first word (not two: its reader read on for a quorum's
    words within that budget, and handed_over does not start another), loses, undoes what it
    was handed, and gets the lock after C's release. Never both at once."""
    gave_up: list[float] = []  # when a waiter's handed_over found no quorum (monotonic)
    handed_over = procedures.handed_over

    def timed(masters_: object, ttl: float, waiter: object) -> object:
        handed = yield from handed_over(masters_, ttl, waiter)  # type: ignore[arg-type]
        if handed is None:
            gave_up.append(time.monotonic())
        return handed

    monkeypatch.setattr(procedures, "handed_over", timed)
    holder_engine = redlock_of(masters)
    b_engine, c_engine = (
        redlock_of(masters, node_timeout=NEWS),
        redlock_of(masters, node_timeout=NEWS),
    )
    holder = holder_engine.lock("hot", ttl=10).acquire()
    # (C holds longer than B's node budget: B's split is settled by its round, not by C's
    # release handing it the rest.)
    with waiting(b_engine, hold=0.3) as b, waiting(c_engine, hold=NEWS + 0.7) as c:
        assert wait_until(lambda: settled(masters, b_engine, c_engine), 5.0), queued(masters)
        b_inbox = b_engine.notices.inbox.removeprefix(b_engine.inbox_prefix)
        soon = int(time.time() * 1000) + 60_000
        for i, m in enumerate(masters):  # B first on the first two masters, C on the others
            for entry in m.call("ZRANGE", QUEUE, 0, -1):
                first = entry.decode().startswith(b_inbox) == (i < 2)
                m.call("ZADD", QUEUE, "XX", soon if first else soon + 1000, entry)
        released = time.monotonic()
        holder.release()
        assert c["acquired"].wait(5.0), (b, c)
        assert b["acquired"].wait(5.0), (b, c)
    assert "error" not in b
    assert "error" not in c
    assert c["released"] <= b["got"], (b, c)  # C first, and never both at once
    assert gave_up, "B's split was not settled by a round"
    assert NEWS - 0.05 <= gave_up[0] - released < NEWS + 0.3, gave_up[0] - released


def test_a_waiting_process_starts_its_watchdog_while_it_waits(masters):
    """The watchdog's thread (one per process) starts when the process begins to wait for a
    lock, not when a release hands it the lock: a thread's start (~1 ms on a busy machine) is
    not paid between the release and the new holder holding it. A fresh process waits here for
    a lock held by this one, which releases it only after the child saw its watchdog run."""
    urls = [m.url for m in masters]
    holder = Redlock(urls)
    lock = holder.lock("watched", ttl=30).acquire()
    code = (
        "import sys, threading, time\n"
        "from django_redlock.engine import Redlock\n"
        "from django_redlock.engine.running.watchdog import WATCHDOG\n"
        f"engine = Redlock({urls!r})\n"
        "got = threading.Event()\n"
        "def wait():\n"
        "    engine.lock('watched', ttl=10, wait=20).acquire()\n"
        "    got.set()\n"
        "print(WATCHDOG._thread is None, flush=True)\n"
        "threading.Thread(target=wait, daemon=True).start()\n"
        "until = time.monotonic() + 5\n"
        "while WATCHDOG._thread is None and time.monotonic() < until:\n"
        "    time.sleep(0.01)\n"
        "print(WATCHDOG._thread is not None, got.is_set(), flush=True)\n"
        "sys.stdin.readline()\n"
        "print(got.wait(10), flush=True)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdin is not None
            assert child.stdout.readline().split() == ["True"]  # not running before it waits
            assert child.stdout.readline().split() == ["True", "False"]  # running, waiting
            lock.release()
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().split() == ["True"]  # then handed the lock
        finally:
            child.kill()
            holder.close()
