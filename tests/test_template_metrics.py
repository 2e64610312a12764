"""Wait and hold histograms per lock template: one series per template (``lock_view``'s and
``@locked``'s keys as written, a guarded command's lock, ``template=``), never per formatted
resource, whatever ids the requests carry."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client import REGISTRY

from django_redlock import LockContended, locked, redlock
from django_redlock.commands import guard_command
from django_redlock.contrib.prometheus import UNTEMPLATED, enabled
from tests.fencedapp.models import Ledger


def count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def series_labelled(value: str) -> list[str]:
    """Every sample of ours that carries ``value`` as a label."""
    return [
        sample.name
        for metric in REGISTRY.collect()
        if metric.name.startswith("redlock_")
        for sample in metric.samples
        if value in sample.labels.values()
    ]


def test_locked_functions_count_under_their_template(redlock_settings):
    assert enabled()

    @locked("report:{user_id}", ttl=5)
    def report(user_id: int) -> int:
        return user_id

    holds = count("redlock_template_hold_seconds_count", template="report:{user_id}")
    waits = count(
        "redlock_template_wait_seconds_count", template="report:{user_id}", outcome="acquired"
    )
    for user_id in range(5):
        report(user_id)
    assert count("redlock_template_hold_seconds_count", template="report:{user_id}") == holds + 5
    assert (
        count(
            "redlock_template_wait_seconds_count", template="report:{user_id}", outcome="acquired"
        )
        == waits + 5
    )
    assert series_labelled("report:3") == []  # no series per formatted key


@pytest.mark.django_db(transaction=True)
@pytest.mark.urls("tests.fencedapp.urls")
def test_views_count_under_their_key_template_and_contention_too(redlock_settings, redlock_of):
    template = "ledger:{name}"
    before = count("redlock_template_hold_seconds_count", template=template)
    contended = count("redlock_template_wait_seconds_count", template=template, outcome="contended")
    for name in ("a", "b", "c"):
        Ledger.objects.create(name=name)
        assert Client().get(f"/add/{name}/").status_code == 200
    with redlock_of(redlock_settings).lock("ledger:a", ttl=5):
        assert Client().get("/add/a/").status_code == 423
    assert count("redlock_template_hold_seconds_count", template=template) == before + 3
    assert (
        count("redlock_template_wait_seconds_count", template=template, outcome="contended")
        == contended + 1
    )
    assert series_labelled("ledger:a") == []


def test_other_locks_count_as_untemplated_or_under_the_template_given(redlock_settings):
    plain = count("redlock_template_hold_seconds_count", template=UNTEMPLATED)
    given = count("redlock_template_hold_seconds_count", template="invoice:{id}")
    with redlock("invoice:42", ttl=5):
        pass
    with redlock("invoice:43", ttl=5, template="invoice:{id}"):
        pass
    with guard_command("tidy"):
        pass
    assert count("redlock_template_hold_seconds_count", template=UNTEMPLATED) == plain + 1
    assert count("redlock_template_hold_seconds_count", template="invoice:{id}") == given + 1
    assert count("redlock_template_hold_seconds_count", template="command:tidy") >= 1


@pytest.mark.parametrize("bad", ["", 3])
def test_a_template_must_be_a_non_empty_str(redlock_settings, bad):
    with pytest.raises(ValueError, match=f"template must be a non-empty str or None, got {bad!r}"):
        redlock("x", template=bad)


def test_contended_outcome_is_labelled(redlock_settings, redlock_of):
    before = count("redlock_template_wait_seconds_count", template="job:{n}", outcome="contended")
    with redlock_of(redlock_settings).lock("job:1", ttl=5):
        with pytest.raises(LockContended):
            with redlock("job:1", template="job:{n}"):
                pass
    after = count("redlock_template_wait_seconds_count", template="job:{n}", outcome="contended")
    assert after == before + 1
