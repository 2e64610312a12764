"""A django-health-check check for the lock masters (the ``health-check`` extra).

    # urls.py
    from health_check.views import HealthCheckView

    path("health/", HealthCheckView.as_view(checks=[
        "health_check.checks.Database",
        "django_redlock.contrib.health_check.Redlock",
    ])),

It probes every master as ``manage.py redlock_status`` does (one probe each, all at once, nothing
locked or changed) and says the same verdict: nothing when locks can be taken with a master to
spare; ``Warning`` when one more failure would stop locking (DEGRADED) or when masters abstain
(quarantine); ``Unavailable`` without a quorum, or when ``REDLOCK`` is not a valid setting (the
system check's message). The message names each master that is down or abstains, its password
masked.
"""

from __future__ import annotations

import dataclasses

from django.core.exceptions import ImproperlyConfigured
from health_check.base import HealthCheck
from health_check.exceptions import ServiceUnavailable, ServiceWarning

from .. import conf
from ..operations.health import DEGRADED, Health, probe_all


# (django-health-check ships no type information: its base class is Any to mypy.)
@dataclasses.dataclass
class Redlock(HealthCheck):  # type: ignore[misc]
    """Whether the ``REDLOCK`` masters can grant locks now, and with how many to spare."""

    def run(self) -> None:
        try:
            engine = conf.get_redlock()
        except ImproperlyConfigured as exc:
            raise ServiceUnavailable(f"REDLOCK is not usable: {exc}") from None
        health = probe_all(engine)
        if not health.has_quorum:
            raise ServiceUnavailable(report(health))
        if health.verdict == DEGRADED or health.abstaining:
            raise ServiceWarning(report(health))


def report(health: Health) -> str:
    """The summary line, then each master that cannot vote and why."""
    troubles = [
        f"{node.node}: {node.error or 'unreachable'}"
        if not node.reachable
        else f"{node.node}: abstains ({node.abstains})"
        for node in health.nodes
        if not node.reachable or node.abstains
    ]
    return "; ".join([health.summary, *troubles])
