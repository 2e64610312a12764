"""The sync engine on real masters (N = 1, 3, 5): acquire, release, extend, contention, expiry."""

from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

from django_redlock.engine import LockContended, LockLost, NodeFailure
from tests.conftest import wait_until

VALUE = re.compile(r"^(?P<token>[0-9a-f]{32,}):(?P<owner>\{.*\})$")


#: These tests are about what the masters answer, not how fast: a budget generous enough that a
#: healthy master stalled by a busy 2-core machine still answers in time.
NODE_TIMEOUT = 0.25


@pytest.fixture
def redlock_of(redlock_of):
    """conftest's factory, with NODE_TIMEOUT as the default budget."""
    return lambda masters, **options: redlock_of(
        masters, **{"node_timeout": NODE_TIMEOUT, **options}
    )


def keys_on(masters, key):
    """The value of ``key`` on each master (None where absent)."""
    return [m.call("GET", key) for m in masters]


def run_out(masters, key):
    """Wait until ``key``'s lease ran out on every master (a 1 s TTL: waited out, never
    guessed, so that a loaded machine only makes the wait longer)."""
    assert wait_until(lambda: keys_on(masters, key) == [None] * len(masters), 10), key


def test_acquire_sets_the_key_on_every_master_and_release_removes_it(any_masters, redlock_of):
    engine = redlock_of(any_masters)
    lock = engine.lock("job", ttl=10)
    assert lock.acquire() is lock
    assert lock.held
    values = keys_on(any_masters, engine.lock_key("job"))
    assert all(v is not None for v in values)
    assert len(set(values)) == 1  # one value, written to all masters
    lock.release()
    assert not lock.held
    assert keys_on(any_masters, engine.lock_key("job")) == [None] * len(any_masters)


def test_with_block_holds_then_releases(any_masters, redlock_of):
    engine = redlock_of(any_masters)
    with engine.lock("job", ttl=10) as lock:
        assert lock.held
        assert None not in keys_on(any_masters, engine.lock_key("job"))
    assert keys_on(any_masters, engine.lock_key("job")) == [None] * len(any_masters)


def test_stored_value_is_a_long_random_token_then_owner_json(any_masters, redlock_of):
    engine = redlock_of(any_masters)
    with engine.lock("job", ttl=10, label="nightly") as lock:
        (raw,) = set(keys_on(any_masters, engine.lock_key("job")))
        ttl_ms = any_masters[0].client().pttl(engine.lock_key("job"))
    match = VALUE.match(raw.decode())
    assert match, raw
    assert len(bytes.fromhex(match["token"])) >= 16
    owner = json.loads(match["owner"])
    assert owner["pid"] == os.getpid()
    assert owner["thread"] == threading.current_thread().name
    assert owner["label"] == "nightly"
    assert owner["ttl"] == 10
    assert abs(owner["since"] - time.time()) < 60
    # No "task": a thread holds it (a field with nothing to say is left out: bytes per lock).
    assert set(owner) == {"host", "pid", "thread", "label", "since", "ttl"}
    assert 9000 < ttl_ms <= 10000
    assert lock.lost is False


def test_tokens_differ_between_acquisitions(masters, redlock_of):
    engine = redlock_of(masters)
    seen = set()
    for _ in range(5):
        with engine.lock("job", ttl=10):
            seen.add(keys_on(masters[:1], engine.lock_key("job"))[0].split(b":")[0])
    assert len(seen) == 5


def test_second_lock_is_contended_with_per_node_held_failures(any_masters, redlock_of):
    engine, other = redlock_of(any_masters), redlock_of(any_masters)  # two "processes"
    with engine.lock("job", ttl=10):
        with pytest.raises(LockContended) as caught:
            other.lock("job", ttl=10).acquire()
    error = caught.value
    assert error.resource == "job"
    assert error.attempts == 1
    assert error.failures == tuple(NodeFailure(node.label, "held") for node in other.nodes)
    assert "held" in str(error)


def test_another_thread_is_contended(masters, redlock_of):
    engine = redlock_of(masters)
    errors = []

    def contend():
        try:
            engine.lock("job", ttl=10).acquire()
        except LockContended as exc:
            errors.append(exc)

    with engine.lock("job", ttl=10):
        thread = threading.Thread(target=contend)
        thread.start()
        thread.join()
    (error,) = errors
    assert [f.reason for f in error.failures] == ["held"] * 5


def test_contended_attempt_leaves_the_holder_untouched(masters, redlock_of):
    engine, other = redlock_of(masters), redlock_of(masters)
    with engine.lock("job", ttl=10) as holder:
        before = keys_on(masters, engine.lock_key("job"))
        with pytest.raises(LockContended):
            other.lock("job", ttl=10).acquire()
        assert keys_on(masters, engine.lock_key("job")) == before
        assert holder.held
        assert holder.extend() > 9


def test_wait_retries_until_the_holder_releases(any_masters, redlock_of):
    """The holder is another thread that releases after 0.2 s; the waiter gets the lock then."""
    engine = redlock_of(any_masters, retry_delay=0.02)
    holding = threading.Event()
    released_at = []

    def hold():
        with engine.lock("job", ttl=10):
            holding.set()
            time.sleep(0.2)
            released_at.append(time.monotonic())

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(5)
        started = time.monotonic()
        with engine.lock("job", ttl=10, wait=5) as waiter:
            got_it = time.monotonic()
            assert waiter.held
    finally:
        holder.join()
    # Not before the holder let go (timed by the holder: a late wake-up of this thread after
    # ``holding`` cannot shorten it, as it could a lower bound on ``got_it - started``).
    assert got_it >= released_at[0]
    assert got_it - started < 4


def test_wait_gives_up_after_wait_with_attempt_count(masters, redlock_of):
    engine, other = redlock_of(masters), redlock_of(masters, retry_delay=0.02)
    with engine.lock("job", ttl=10):
        started = time.monotonic()
        with pytest.raises(LockContended) as caught:
            other.lock("job", ttl=10, wait=0.2).acquire()
        elapsed = time.monotonic() - started
    assert caught.value.attempts > 1
    assert 0.15 < elapsed < 0.2 + 0.5


def test_extend_renews_the_lease_on_every_master(any_masters, redlock_of):
    engine = redlock_of(any_masters)
    key = engine.lock_key("job")
    with engine.lock("job", ttl=2) as lock:
        time.sleep(0.6)
        before = lock.validity
        renewed = lock.extend()
        assert renewed > before
        assert 1.5 < renewed < 2
        # The round returned at quorum: the last masters' renewals land a moment later (on a
        # loaded machine they may still be queued there). Not renewed, a master shows at most
        # 1,400 ms by now; renewed, more for the next 600 ms.
        for m in any_masters:
            client = m.client()
            assert wait_until(lambda c=client: 1400 < c.pttl(key) <= 2000, 0.5), m


def test_validity_is_within_ttl_and_decreases(masters, redlock_of):
    engine = redlock_of(masters)
    with engine.lock("job", ttl=5) as lock:
        first = lock.validity
        assert 0 < first < 5
        time.sleep(0.05)
        second = lock.validity
        assert 0 < second < first
    assert lock.validity == 0.0


def test_expired_lock_cannot_be_extended(any_masters, redlock_of):
    engine = redlock_of(any_masters)
    lock = engine.lock("job", ttl=1.0).acquire()
    run_out(any_masters, lock.key)
    assert lock.lost
    with pytest.raises(LockLost, match="was lost"):
        lock.extend()
    with pytest.raises(LockLost, match="ran out"):  # a release that did not happen says so
        lock.release()
    assert lock.lost  # still readable after the release


def test_expired_owner_cannot_delete_the_next_owners_key(any_masters, redlock_of):
    engine, other = redlock_of(any_masters), redlock_of(any_masters)
    old = engine.lock("job", ttl=1.0).acquire()
    run_out(any_masters, old.key)
    new = other.lock("job", ttl=10).acquire()
    mine = keys_on(any_masters, engine.lock_key("job"))
    with pytest.raises(LockLost):
        old.extend()
    with pytest.raises(LockLost):
        old.release()  # compare-and-delete: not the old owner's value any more
    assert keys_on(any_masters, engine.lock_key("job")) == mine
    assert new.held
    new.release()
    assert keys_on(any_masters, engine.lock_key("job")) == [None] * len(any_masters)


def test_extend_after_the_key_was_taken_over_is_lost_and_leaves_the_new_ttl(
    any_masters, redlock_of
):
    """The server-side check: our lease is still valid on our clock, but the key is gone (forced
    release) and a new owner holds it. extend must not re-create or re-time the new key."""
    engine, other = redlock_of(any_masters), redlock_of(any_masters)
    old = engine.lock("job", ttl=10).acquire()
    for m in any_masters:
        m.client().delete(engine.lock_key("job"))
    new = other.lock("job", ttl=2).acquire()
    with pytest.raises(LockLost, match="gone from"):
        old.extend()
    assert old.lost
    for m in any_masters:
        assert m.client().pttl(engine.lock_key("job")) <= 2000
    assert new.held
    new.release()


def test_an_expired_unreleased_lease_does_not_block_its_own_thread(masters, redlock_of):
    """Was a bug: the dead lease still counted as 'held by this same thread' (LockContended at
    once, no network) although every master was free."""
    engine = redlock_of(masters)
    old = engine.lock("job", ttl=1.0).acquire()
    run_out(masters, old.key)
    assert old.lost
    assert keys_on(masters, engine.lock_key("job")) == [None] * 5
    with engine.lock("job", ttl=5) as new:
        assert new.held
        with pytest.raises(LockLost):
            old.release()  # the dead handle's compare-and-delete leaves the new key alone
        assert None not in keys_on(masters, engine.lock_key("job"))


def test_leaving_the_block_after_expiry_raises_lock_lost(any_masters, redlock_of):
    engine = redlock_of(any_masters)
    with pytest.raises(LockLost, match="ran out"), engine.lock("job", ttl=1.0) as lock:
        run_out(any_masters, lock.key)
    # And the lock is free again for the next owner.
    with engine.lock("job", ttl=1) as lock:
        assert lock.held


def test_lost_lease_does_not_mask_the_blocks_own_error(masters, redlock_of):
    engine = redlock_of(masters)

    def outlive_the_lease_then_fail():
        with engine.lock("job", ttl=1.0) as lock:
            run_out(masters, lock.key)
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom") as caught:
        outlive_the_lease_then_fail()
    assert any("was lost" in note for note in caught.value.__notes__)


def test_error_inside_a_valid_block_releases_and_propagates_untouched(masters, redlock_of):
    engine = redlock_of(masters)
    with pytest.raises(KeyError) as caught, engine.lock("job", ttl=10):
        raise KeyError("boom")
    assert not getattr(caught.value, "__notes__", None)
    assert keys_on(masters, engine.lock_key("job")) == [None] * 5


def test_release_survives_script_flush(any_masters, redlock_of):
    engine = redlock_of(any_masters)
    lock = engine.lock("job", ttl=10).acquire()
    lock.extend()  # the scripts are now cached on every master...
    for m in any_masters:
        m.client().script_flush()  # ...and forgotten
    lock.release()
    assert keys_on(any_masters, engine.lock_key("job")) == [None] * len(any_masters)


def test_extend_survives_script_flush(masters, redlock_of):
    engine = redlock_of(masters)
    with engine.lock("job", ttl=5) as lock:
        for m in masters:
            m.client().script_flush()
        before = lock.validity
        # Renewed (a failed extend raises), by a round however slow: no margin on its time.
        assert lock.extend() > before


def test_one_object_is_one_lease(masters, redlock_of):
    engine = redlock_of(masters)
    lock = engine.lock("job", ttl=10).acquire()
    with pytest.raises(RuntimeError, match="already acquired"):
        lock.acquire()
    lock.release()
    with pytest.raises(RuntimeError, match="not acquired"):
        lock.release()
    with pytest.raises(RuntimeError, match="not acquired"):
        lock.extend()
    # Released, the same object can be acquired again.
    with lock:
        assert lock.held


def test_different_resources_do_not_contend(masters, redlock_of):
    engine = redlock_of(masters)
    with engine.lock("a", ttl=10), engine.lock("b", ttl=10) as b:
        assert b.held


def test_close_stops_the_release_notice_listeners(fresh_masters, redlock_of):
    """Was a bug: close() left one listener thread and SUBSCRIBE connection per master running
    for the life of the process."""
    masters = fresh_masters(3)  # ports of this test only: no other engine's threads match
    holder, waiter = redlock_of(masters), redlock_of(masters, retry_delay=0.02)
    labels = [node.label for node in waiter.nodes]

    def listeners():
        return [t for t in threading.enumerate() if any(label in t.name for label in labels)]

    with holder.lock("job", ttl=5), pytest.raises(LockContended):
        waiter.lock("job", ttl=5, wait=0.1).acquire()
    assert len(listeners()) == 1  # waiting subscribed to release notices on every master
    waiter.close()
    deadline = time.monotonic() + 1
    while listeners() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert listeners() == []
