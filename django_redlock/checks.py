"""System checks for the REDLOCK setting (no network, but for W004, a deploy check only:
``manage.py redlock_status`` probes masters).

Ids: E001 no nodes, E002 malformed setting, E003 bad node entry, E004 duplicate node,
E005 bad number, E006 NODE_TIMEOUT not small next to TTL, E007 QUARANTINE without MAX_TTL,
E009 a member's wait_timeout (replica acknowledgement) that does not fit in NODE_TIMEOUT,
W001 even number of nodes, W002 one node (development: no fault tolerance), W003 Sentinel or
Cluster members without quarantine, W004 (``check --deploy`` only) a Redis Cluster member none
of whose seeds tells the slot map (0.5 s a seed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.core.checks import CheckMessage, Error, Warning

from . import conf


def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    return _messages(conf.problems())


def check_clusters_reachable(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """A deploy check (``manage.py check --deploy``), and a warning: it connects (each seed of
    each Cluster member), which no management command should pay for, and a cluster down while
    ``migrate`` runs must not stop it (that member's votes fail, as a plain master's would)."""
    return _messages(conf.unreachable_clusters())


def _messages(problems: list[conf.Problem]) -> list[CheckMessage]:
    return [
        (Error if p.is_error else Warning)(p.message, hint=p.hint, id=f"django_redlock.{p.id}")
        for p in problems
    ]
