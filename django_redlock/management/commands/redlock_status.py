"""``manage.py redlock_status``: are the lock masters healthy, and which locks are held?

A health check for monitoring and cron. The verdict is one of three, and so is the exit status
(the Nagios convention): ``OK`` (0: one or more masters may still fail; or a single master, the
development setup, which answers), ``DEGRADED`` (1: locking works, but one more failed master
stops it), ``NO QUORUM`` (2: locks can be neither acquired nor extended). A broken ``REDLOCK``
setting is no verdict: exit status 3 (UNKNOWN), and ``{"verdict": "ERROR", "error": ...}`` under
``--json``, which otherwise prints the same facts as the text. Tokens are never printed: a holder
is named by the fingerprint of its token; every name is printed through ``display.printable``.

The text fits in 100 columns: a table too wide for that is printed as one block per row.
``--wide`` prints full tables.
"""

from __future__ import annotations

import json
import sys
import textwrap
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import conf
from ...operations import health, inventory
from ...operations.display import printable
from ...operations.health import Health, NodeHealth
from ...operations.held import HeldLock
from ...operations.inventory import Inventory

#: Exit status per verdict.
EXIT_STATUS = {health.OK: 0, health.DEGRADED: 1, health.NO_QUORUM: 2}
#: Exit status when the REDLOCK setting is broken: no verdict (UNKNOWN, as monitoring plugins say).
EXIT_ERROR = 3
#: Columns the default output fits in.
WIDTH = 100


class Command(BaseCommand):
    help = (
        "Show each Redis lock master's health (reachability, round trip, version, role, "
        "persistence, eviction policy, clock), the verdict and the locks held now. Exit status: "
        "0 OK, 1 DEGRADED (one more failure stops locking), 2 NO QUORUM, 3 the REDLOCK setting "
        "is broken."
    )
    # A health check must not fail because of another app's check, and our own settings are
    # validated below with a clear message (get_config); so no system checks here.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
        parser.add_argument(
            "--wide", action="store_true", help=f"full tables, even wider than {WIDTH} columns"
        )
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
            # Not a verdict about the masters, which were never asked: UNKNOWN to monitoring.
            if options["json"]:
                self.stdout.write(json.dumps({"verdict": "ERROR", "error": str(exc)}, indent=2))
            raise CommandError(f"REDLOCK setting: {exc}", returncode=EXIT_ERROR) from exc
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
            self.stdout.write(render(status, found, warnings, wide=options["wide"]))
        if status.verdict != health.OK:
            code = EXIT_STATUS[status.verdict]
            if getattr(self, "_called_from_command_line", False):
                # From a shell the verdict is printed once: the text above already says it, and
                # under --json (stdout for machines) stderr says it for the human.
                if options["json"]:
                    self.stderr.write(status.summary)
                sys.exit(code)
            raise CommandError(status.summary, returncode=code)


def as_json(status: Health, found: Inventory, warnings: list[str]) -> dict[str, Any]:
    return {
        "verdict": status.verdict,
        "healthy": status.has_quorum,  # locking works (OK or DEGRADED)
        "can_lose": max(status.spare, 0),
        "quorum": status.quorum,
        "reachable": status.reachable,
        "abstaining": status.abstaining,
        "masters": [asdict(node) for node in status.nodes],
        "clock_spread": status.clock_spread,
        "errors": status.same_servers,
        "warnings": warnings + ([status.clock_warning] if status.clock_warning else []),
        "locks": {
            "total": found.total,
            "page": found.page,
            "pages": found.pages,
            "page_size": found.page_size,
            "unread_masters": [str(f) for f in found.failures],
            "items": [_lock_json(lock) for lock in found.locks],
            "unreadable": [asdict(key) for key in found.unreadable],
            "groups": [asdict(group) for group in found.groups],
        },
    }


def _lock_json(lock: HeldLock) -> dict[str, Any]:
    data = asdict(lock)
    data["has_quorum"] = lock.has_quorum
    data["state"] = lock.state
    data["resources"] = list(lock.names)  # a lock over several resources: all of them
    return data


def render(status: Health, found: Inventory, warnings: list[str], *, wide: bool = False) -> str:
    width = None if wide else WIDTH
    lines = [f"Redlock masters: {status.summary}", ""]
    lines += _table(
        ["MASTER", "UP", "RTT", "VERSION", "ROLE", "AOF/FSYNC", "EVICTION", "CLOCK"],
        [_node_row(node) for node in status.nodes],
        width,
    )
    errors = status.same_servers
    if errors:
        lines += ["", "Errors:"] + [f"  - {error}" for error in errors]
    notes = _grouped_warnings(status)
    notes += [f"{node.node}: {node.error}" for node in status.nodes if node.error]
    notes += [f"{n.node}: {n.abstains}" for n in status.nodes if n.abstains]
    notes += [f"setting: {w}" for w in warnings]
    if notes:
        lines += ["", "Warnings:"] + [f"  - {note}" for note in notes]
    lines += ["", f"Held locks: {found.total} (page {found.page} of {found.pages})"]
    for failure in found.failures:
        lines.append(f"  could not read {failure}: copies there are unknown, counts may be low")
    if found.locks:
        lines += _table(
            ["RESOURCE", "STATE", "HELD", "VALIDITY", "TTL MIN/MAX", "FENCE", "HOLDER"]
            + ["OWNER", "SINCE", "STALE COPIES"],
            [_lock_row(lock) for lock in found.locks],
            width,
        )
    if found.groups:
        lines += ["", "Semaphores and readers/writer locks:"]
        lines += [f"  - {printable(group.describe())}" for group in found.groups]
    if found.unreadable:
        lines += ["", f"Unreadable keys under the lock prefix: {len(found.unreadable)}"]
        lines += [
            f"  - {printable(key.resource)} on {key.node}: {key.kind}, {key.size_text}: "
            f"{key.reason}"
            for key in found.unreadable
        ]
    if width is None:
        return "\n".join(lines)
    return "\n".join(_wrap(line, width) for line in lines)


def _wrap(line: str, width: int) -> str:
    """A long line folded under its own indentation (a list item under its text)."""
    if len(line) <= width:
        return line
    indent = " " * (len(line) - len(line.lstrip(" -")))
    return "\n".join(textwrap.wrap(line, width, subsequent_indent=indent, break_on_hyphens=False))


def _grouped_warnings(status: Health) -> list[str]:
    """One line per distinct warning, naming its masters ("every reachable master" when all that
    answered have it), so that a setting shared by five masters is said once."""
    by_text: dict[str, list[str]] = {}
    for node in status.nodes:
        for warning in node.warnings:
            by_text.setdefault(warning, []).append(node.node)
    reachable = sum(n.reachable for n in status.nodes)
    out = [
        f"{_which(nodes, reachable, len(status.nodes))}: {text}" for text, nodes in by_text.items()
    ]
    return out + ([status.clock_warning] if status.clock_warning else [])


def _which(nodes: list[str], reachable: int, total: int) -> str:
    if len(nodes) == total > 1:
        return "all masters"
    if len(nodes) == reachable > 1:
        return "every reachable master"
    return ", ".join(nodes)


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
    held = f"{lock.held_on}/{lock.node_count}" + (f" ({lock.unread} unread)" if lock.unread else "")
    stale = ", ".join(
        f"{c.fingerprint}@{c.node}" + ("" if c.ttl is None else f" ({c.ttl:.1f} s)")
        for c in lock.stale
    )
    return [
        printable(lock.name + _member(lock)),
        lock.state,
        held,
        f"{lock.validity:.1f} s" if lock.has_quorum else "none",
        ttl,
        "-" if lock.fence is None else str(lock.fence),
        lock.fingerprint,
        printable(str(lock.owner)),
        _utc(lock.owner.since),
        stale or "-",
    ]


def _member(lock: HeldLock) -> str:
    """What a semaphore's permit or a reader is a member of (empty for a lock)."""
    if lock.mode == "permit":  # (the limit is unknown once the semaphore's marker is gone)
        limit = "" if lock.limit is None else f", limit {lock.limit}"
        return f" (permit of {lock.group}{limit})"
    if lock.mode == "reader":
        return f" (reader of {lock.group})"
    return ""


def _utc(unix_seconds: float | None) -> str:
    if unix_seconds is None:
        return "?"
    try:
        return datetime.fromtimestamp(unix_seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # not a time we can show
        return "?"


def _table(header: list[str], rows: list[list[str]], width: int | None) -> list[str]:
    """Columns when they fit in ``width`` (or ``width`` is None); else one block per row, its
    first cell as the title and each other cell on a line of its own."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    if width is None or 2 + sum(widths) + 2 * (len(widths) - 1) <= width:
        return [
            "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in [header, *rows]
        ]
    label = max(len(name) for name in header[1:])
    out = []
    for row in rows:
        out.append(f"  {row[0]}")
        pairs = zip(header[1:], row[1:], strict=True)
        out += [f"      {name.lower():<{label}}  {cell}" for name, cell in pairs]
    return out
