"""django_redlock.contrib.health_check through django-health-check's real view (its JSON, its
HTTP status), over real masters: healthy, one failure from the edge, no quorum, abstaining
members, a broken setting."""

from __future__ import annotations

import pytest
from django.urls import path
from health_check.views import HealthCheckView

pytestmark = pytest.mark.urls(__name__)

urlpatterns = [
    path(
        "health/",
        HealthCheckView.as_view(checks=["django_redlock.contrib.health_check.Redlock"]),
    ),
]

KEY = "Redlock()"  # how django-health-check names the check in its JSON


def probe(client) -> tuple[int, str]:
    response = client.get("/health/?format=json")
    return response.status_code, response.json()[KEY]


def test_healthy_masters_are_ok(client, settings, masters):
    settings.REDLOCK = {"NODES": [m.url for m in masters[:3]]}
    assert probe(client) == (200, "OK")


def test_one_master_down_of_five_is_still_ok(client, settings, fresh_masters):
    five = fresh_masters(5)
    five[0].kill()
    settings.REDLOCK = {"NODES": [m.url for m in five]}
    assert probe(client) == (200, "OK")


def test_one_failure_from_the_edge_is_a_warning_naming_the_master(client, settings, fresh_masters):
    three = fresh_masters(3)
    settings.REDLOCK = {
        "NODES": [f"redis://:pw-secret@127.0.0.1:{three[0].port}/0", three[1].url, three[2].url]
    }
    three[0].kill()
    status, text = probe(client)
    assert status == 500
    assert text.startswith("Warning: 2 of 3 masters reachable, quorum 2: DEGRADED")
    assert f"redis://:***@127.0.0.1:{three[0].port}/0: " in text
    assert "pw-secret" not in text


def test_no_quorum_is_unavailable(client, settings, fresh_masters):
    three = fresh_masters(3)
    settings.REDLOCK = {"NODES": [m.url for m in three]}
    three[0].kill()
    three[1].kill()
    status, text = probe(client)
    assert status == 500
    assert text.startswith("Unavailable: 1 of 3 masters reachable, quorum 2: NO QUORUM")


def test_abstaining_members_are_named(client, settings, fresh_masters):
    """Under quarantine, masters up for less than MAX_TTL do not vote: all three here."""
    three = fresh_masters(3)
    settings.REDLOCK = {"NODES": [m.url for m in three], "MAX_TTL": 600, "QUARANTINE": True}
    status, text = probe(client)
    assert status == 500
    assert text.startswith("Unavailable: 3 of 3 masters reachable (3 abstaining)")
    assert text.count(": abstains (quarantine: up only") == 3


def test_a_setting_without_members_is_the_system_checks_error_not_a_crash(client, settings):
    settings.REDLOCK = {"NODES": []}
    status, text = probe(client)
    assert status == 500
    assert text.startswith("Unavailable: REDLOCK is not usable: REDLOCK['NODES']")
