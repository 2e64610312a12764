"""``manage.py redlock_status``: are the lock masters healthy, and which locks are held?

A health check for load balancers and cron: it exits 0 when a quorum of masters answers and
non-zero (``CommandError``) when not. ``--json`` prints the same facts for machines. Tokens are
never printed: a holder is named by the fingerprint of its token.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import conf, health, inventory
from ...health import Health, NodeHealth
from ...inventory import HeldLock, Inventory


class Command(BaseCommand):
    help = (
        "Show each Redis lock master's health (reachability, round trip, version, role, "
        "persistence, eviction policy, clock skew), quorum health and the locks held now. "
        "Exits non-zero when a quorum of masters is not reachable."
    )
    # A health check must not fail because of another app's check, and our own settings are
    # validated below with a clear message (get_config); so no system checks here.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument("--search", default="", help="only locks whose resource contains this")
        parser.add_argument(
            "--limit", type=int, default=100, help="at most this many locks (default 100)"
        )
        parser.add_argument("--page", type=int, default=1, help="page of --limit locks (from 1)")
        parser.add_argument(
            "--timeout",
            type=float,
            default=health.PROBE_TIMEOUT,
            help=f"seconds to wait for each master's answers (default {health.PROBE_TIMEOUT})",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            conf.get_config()
            redlock = conf.get_redlock()
        except ImproperlyConfigured as exc:
            raise CommandError(f"REDLOCK setting: {exc}") from exc
        timeout = options["timeout"]
        if not timeout > 0:
            raise CommandError(f"--timeout must be a positive number of seconds, got {timeout!r}")
        try:
            found = inventory.list_locks(
                redlock,
                search=options["search"],
                page=options["page"],
                page_size=options["limit"],
                timeout=timeout,
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        status = health.probe_all(redlock, timeout=timeout)
        warnings = [p.message for p in conf.problems()]  # setting warnings (errors raised above)
        if options["json"]:
            self.stdout.write(json.dumps(as_json(status, found, warnings), indent=2))
        else:
            self.stdout.write(render(status, found, warnings))
        if not status.has_quorum:
            raise CommandError(f"no quorum: {status.summary}")


def as_json(status: Health, found: Inventory, warnings: list[str]) -> dict[str, Any]:
    return {
        "healthy": status.has_quorum,
        "quorum": status.quorum,
        "reachable": status.reachable,
        "masters": [asdict(node) for node in status.nodes],
        "warnings": warnings,
        "locks": {
            "total": found.total,
            "page": found.page,
            "pages": found.pages,
            "page_size": found.page_size,
            "unread_masters": [str(f) for f in found.failures],
            "items": [_lock_json(lock) for lock in found.locks],
            "unreadable": [asdict(key) for key in found.unreadable],
        },
    }


def _lock_json(lock: HeldLock) -> dict[str, Any]:
    data = asdict(lock)
    data["has_quorum"] = lock.has_quorum
    return data


def render(status: Health, found: Inventory, warnings: list[str]) -> str:
    lines = [f"Redlock masters: {status.summary}", ""]
    lines += _table(
        ["MASTER", "REACHABLE", "RTT", "VERSION", "ROLE", "AOF/FSYNC", "MAXMEMORY-POLICY", "SKEW"],
        [_node_row(node) for node in status.nodes],
    )
    notes = _grouped_warnings(status)
    notes += [f"{node.node}: unreachable: {node.error}" for node in status.nodes if node.error]
    notes += [f"setting: {w}" for w in warnings]
    if notes:
        lines += ["", "Warnings:"] + [f"  - {note}" for note in notes]
    lines += ["", f"Held locks: {found.total} (page {found.page} of {found.pages})"]
    for failure in found.failures:
        lines.append(f"  could not read {failure} (counts may be low)")
    if found.locks:
        lines += _table(
            ["RESOURCE", "HELD", "TTL MIN/MAX", "VALIDITY", "OWNER", "SINCE", "FENCE", "HOLDER"]
            + ["STALE COPIES"],
            [_lock_row(lock) for lock in found.locks],
        )
    if found.unreadable:
        lines += ["", f"Unreadable keys under the lock prefix: {len(found.unreadable)}"]
        lines += [
            f"  - {key.resource} on {key.node}: {key.kind}, {key.size_text}: {key.reason}"
            for key in found.unreadable
        ]
    return "\n".join(lines)


def _grouped_warnings(status: Health) -> list[str]:
    """One line per distinct warning, naming its masters ("all masters" when every one has it),
    so that a setting shared by five masters is said once."""
    by_text: dict[str, list[str]] = {}
    for node in status.nodes:
        for warning in node.warnings:
            by_text.setdefault(warning, []).append(node.node)
    return [
        f"{'all masters' if len(nodes) == len(status.nodes) > 1 else ', '.join(nodes)}: {text}"
        for text, nodes in by_text.items()
    ]


def _node_row(node: NodeHealth) -> list[str]:
    if not node.reachable:
        return [node.node, "NO", "-", "-", "-", "-", "-", "-"]
    return [
        node.node,
        "yes",
        f"{node.rtt_ms:.2f} ms",
        node.version,
        node.role if node.role == "master" else f"{node.role} (!)",
        f"{node.appendonly}/{node.appendfsync}",
        node.maxmemory_policy,
        "unknown" if node.clock_skew is None else f"{node.clock_skew:+.3f} s",
    ]


def _lock_row(lock: HeldLock) -> list[str]:
    ttl = "no expiry" if lock.min_ttl is None else f"{lock.min_ttl:.1f}/{lock.max_ttl:.1f} s"
    held = f"{lock.held_on}/{lock.node_count}" + ("" if lock.has_quorum else " (no quorum)")
    since = _utc(lock.owner.since)
    stale = ", ".join(
        f"{c.fingerprint}@{c.node}" + ("" if c.ttl is None else f" ({c.ttl:.1f} s)")
        for c in lock.stale
    )
    return [
        lock.resource,
        held,
        ttl,
        f"{lock.validity:.1f} s" if lock.has_quorum else "none",
        str(lock.owner),
        since,
        "-" if lock.fence is None else str(lock.fence),
        lock.fingerprint,
        stale or "-",
    ]


def _utc(unix_seconds: float | None) -> str:
    if unix_seconds is None:
        return "?"
    try:
        return datetime.fromtimestamp(unix_seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # not a time we can show
        return "?"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    ]
