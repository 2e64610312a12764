"""The quorum matrix: for every subset of masters already holding the lock for another owner,
acquisition succeeds iff a quorum of masters is free, fails with ``LockContended`` otherwise, and
never touches the other owner's keys (compare-and-delete only ever removes our own value)."""

from __future__ import annotations

import itertools

import pytest

from django_redlock.engine import LockContended
from tests.conftest import wait_until

OTHER_OWNER = b"f" * 32 + b':{"host":"elsewhere","pid":1,"label":"other"}'
OTHER_TTL_MS = 60_000


#: These tests are about what the masters answer, not how fast: a budget generous enough that a
#: healthy master stalled by a busy 2-core machine still answers in time.
NODE_TIMEOUT = 0.25


@pytest.fixture
def redlock_of(redlock_of):
    """conftest's factory, with NODE_TIMEOUT as the default budget."""
    return lambda masters, **options: redlock_of(
        masters, **{"node_timeout": NODE_TIMEOUT, **options}
    )


def subsets(n):
    return [set(c) for k in range(n + 1) for c in itertools.combinations(range(n), k)]


def check_matrix(masters, engine):
    key = engine.lock_key("job")
    clients = [m.client() for m in masters]
    try:
        for occupied in subsets(len(masters)):
            for c in clients:
                c.delete(key)
            for i in occupied:
                clients[i].set(key, OTHER_OWNER, px=OTHER_TTL_MS)
            free = len(masters) - len(occupied)
            lock = engine.lock("job", ttl=10)
            if free >= engine.quorum:
                lock.acquire()
                assert lock.held, occupied
                mine = clients[next(i for i in range(len(masters)) if i not in occupied)].get(key)
                assert mine != OTHER_OWNER
                # Every free master takes it; the last may apply it after the round returned
                # at quorum (a loaded machine).
                free_clients = [c for i, c in enumerate(clients) if i not in occupied]
                assert wait_until(
                    lambda ours=mine, on=free_clients: [c.get(key) for c in on] == [ours] * len(on),
                    5,
                ), occupied
                lock.release()
            else:
                with pytest.raises(LockContended) as caught:
                    lock.acquire()
                assert not lock.held
                assert sorted(f.node for f in caught.value.failures) == sorted(
                    engine.nodes[i].label for i in occupied
                )
                assert {f.reason for f in caught.value.failures} == {"held"}
            # Ours is gone everywhere (released, or cleaned up after the failed attempt)...
            assert [c.get(key) for i, c in enumerate(clients) if i not in occupied] == [
                None
            ] * free, occupied
            # ...and the other owner's keys are untouched, TTL included.
            for i in occupied:
                assert clients[i].get(key) == OTHER_OWNER, (occupied, i)
                assert OTHER_TTL_MS - 5_000 < clients[i].pttl(key) <= OTHER_TTL_MS
    finally:
        for c in clients:
            c.delete(key)
            c.close()


def test_quorum_matrix(any_masters, redlock_of):
    """N=5: 32 subsets, success iff >= 3 free; N=3: 8 subsets, iff >= 2; N=1: 2 subsets."""
    n = len(any_masters)
    engine = redlock_of(any_masters)
    assert engine.quorum == {1: 1, 3: 2, 5: 3}[n]
    assert len(subsets(n)) == 2**n
    check_matrix(any_masters, engine)
