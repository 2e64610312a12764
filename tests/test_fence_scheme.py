"""The fencing scheme as a model: property tests over random quorums and restarts.

The engine issues a token in two rounds (``Lock._fence``): read the counter on every master,
take ``protocol.fence_merge`` (max + 1 over a quorum of answers), then raise every master's
counter to it (``scripts.FENCE_RAISE``, a max-register) and use it only if a quorum acknowledged.
Here the masters are a list of ints and the same merge function decides; hypothesis chooses which
masters answer each round and which restart empty.

The guarantee under test: tokens that were used strictly increase, as long as a quorum of
masters still holds the latest used token whenever one restarts empty. The second test drops
that condition and shows the checker catches the resulting repeat, so the first one can fail.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from django_redlock.engine.base import protocol

N = 5
Q = protocol.quorum(N)

subsets = st.sets(st.integers(0, N - 1))
step = st.one_of(
    st.tuples(st.just("issue"), subsets, subsets),  # who answers the read, who the write-back
    st.tuples(st.just("restart"), st.integers(0, N - 1), st.just(frozenset())),
)


def play(steps: list[tuple[str, object, object]], *, guard_restarts: bool) -> list[int]:
    """Run the scheme; return the tokens that were used, in order."""
    counters = [0] * N
    used: list[int] = []
    for kind, a, b in steps:
        if kind == "restart":
            node = a
            assert isinstance(node, int)
            holding = [i for i in range(N) if used and counters[i] >= used[-1] and i != node]
            if guard_restarts and used and len(holding) < Q:
                continue  # the documented condition: a quorum keeps the latest token
            counters[node] = 0
            continue
        readers, writers = a, b
        assert isinstance(readers, set)
        assert isinstance(writers, set)
        token = protocol.fence_merge([counters[i] if i in readers else None for i in range(N)], N)
        if token is None:
            continue  # no quorum answered the read: no token
        for i in writers:
            counters[i] = max(counters[i], token)  # FENCE_RAISE
        if len(writers) >= Q:
            used.append(token)  # acknowledged by a quorum: the holder may use it
    return used


@settings(max_examples=400, deadline=None)
@given(st.lists(step, max_size=40))
def test_used_tokens_strictly_increase(steps: list[tuple[str, object, object]]) -> None:
    used = play(steps, guard_restarts=True)
    assert all(a < b for a, b in zip(used, used[1:], strict=False)), used


def test_the_checker_fails_when_too_many_masters_restart_empty() -> None:
    # Token 1 is written back to masters 0-2 only (a bare quorum); master 0 restarts empty;
    # the next read quorum (0, 3, 4) sees no trace of it and issues 1 again.
    steps: list[tuple[str, object, object]] = [
        ("issue", {0, 1, 2, 3, 4}, {0, 1, 2}),
        ("restart", 0, frozenset()),
        ("issue", {0, 3, 4}, {0, 3, 4}),
    ]
    assert play(steps, guard_restarts=True) == [1, 2]  # guarded: the restart is refused
    used = play(steps, guard_restarts=False)
    assert used == [1, 1]
    assert not all(a < b for a, b in zip(used, used[1:], strict=False))
