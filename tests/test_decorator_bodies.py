"""The function decorator (``@locked``) of issue 23: the lock covers the whole body of a generator
function, sync or async (items 2), and a template field may come from the ``**`` parameter
whatever its name (item 14). Real redis-server masters; the other client is a real one."""

from __future__ import annotations

import pytest

from django_redlock.engine import LockContended


def test_a_template_field_from_a_var_keyword_parameter_of_any_name(masters, redlock_of):
    engine = redlock_of(masters)
    seen: list[bool] = []

    @engine.locked("report:{user_id}", ttl=10)
    def report(**options: object) -> object:
        seen.append(engine.is_locked(f"report:{options['user_id']}"))
        return options["user_id"]

    assert report(user_id=7) == 7
    assert seen == [True]
    with engine.lock("report:8", ttl=10), pytest.raises(LockContended):
        report(user_id=8)  # the field named the right resource: the held one
    assert seen == [True]
