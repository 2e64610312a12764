"""What the fuzzer's callers recorded, and the checker that judges it.

Every caller appends one JSON line per critical section to its process's journal (``Section``),
timed on ``time.monotonic()`` (CLOCK_MONOTONIC: one clock for every process of the machine).
Each time errs on the safe side, so a correct lock never trips the checker: ``acquired`` is read
after the lock was won, ``valid_until`` from a validity read after that (pushed later only by a
renewal the caller saw), ``released`` before the lock is let go.

The checker judges histories, never timings: each rule below holds for every interleaving a
correct lock allows, however slow the machine.

- **exclusive**: for each resource, no two exclusive sections (a plain lock, a lock over several
  resources, a re-entered lock, a writer) overlap while both were valid;
- **permits**: never more than ``limit`` valid permits of a semaphore at once;
- **readers**: never a reader (or another writer) beside a valid writer;
- **fences**: per resource, tokens strictly increase in acquisition order, and the fenced store
  accepted them in strictly increasing order;
- **counter**: each resource's counter (GET, work, SET, only if the lock still said it was held;
  never INCR) ends equal to the sections that wrote it;
- **release**: a ``release()`` that returned normally had not outlived the lease on every master
  (it began less than ``ttl`` after the last grant or renewal the caller saw returned);
- **owned**: ``owned()`` never said "a quorum holds our lease" while another exclusive holder of
  the same resource was valid for the whole question;
- **every lease accounted for**: each section ends with its release's outcome, unless its process
  was killed while holding it.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.checkers import Section as Interval
from bench.chaos.checkers import overlaps
from bench.chaos.permits import Stretch, beside_writer, over_limit

EXCLUSIVE = frozenset({"plain", "multi", "reentrant", "writer"})

#: How long after the last grant or renewal a release may still find its keys: the lease's TTL,
#: plus this much for the master's own expiry clock (Redis expires keys on its wall clock, a few
#: ms from CLOCK_MONOTONIC's view) so that the rule stays sound.
EXPIRY_SLACK = 0.25


@dataclass(frozen=True, slots=True)
class Section:
    """One critical section as its caller saw it."""

    caller: str  # "process/caller"
    seq: int
    kind: str  # "plain", "multi", "reentrant", "writer", "reader", "permit"
    resources: tuple[str, ...]
    ttl: float
    acquired: float
    valid_until: float
    released: float | None  # None: the process was killed while holding it
    renewed: float  # when the last grant or renewal the caller saw returned
    auto_extend: bool = False
    fences: Mapping[str, int] = field(default_factory=dict)
    counted: tuple[str, ...] = ()  # resources whose counter this section wrote
    release: str = "ok"  # "ok", "lost" (LockLost), "unconfirmed", "killed"
    #: ``owned()`` asked inside the section: (asked, answered, what it said), or None.
    owned: tuple[float, float, bool] | None = None

    @property
    def end(self) -> float:
        released = self.valid_until if self.released is None else self.released
        return min(released, self.valid_until)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Section:
        fields = {k: v for k, v in record.items() if k not in {"type", "checked", "wrote"}}
        fields["resources"] = tuple(fields["resources"])
        fields["counted"] = tuple(fields.get("counted", ()))
        fields["fences"] = {str(k): int(v) for k, v in fields.get("fences", {}).items()}
        if fields.get("owned") is not None:
            fields["owned"] = tuple(fields["owned"])
        return cls(**fields)


@dataclass
class Violation:
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"


@dataclass
class Verdict:
    sections: int
    by_kind: dict[str, int]
    violations: list[Violation]
    counters: dict[str, tuple[int, int]]  # resource -> (counted, final value)

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items()))
        head = f"{self.sections} sections ({kinds}); {len(self.violations)} violations"
        rules: dict[str, int] = defaultdict(int)
        for v in self.violations:
            rules[v.rule] += 1
        if rules:
            head += " (" + ", ".join(f"{r} {n}" for r, n in sorted(rules.items())) + ")"
        return head


def describe(s: Section) -> str:
    return (
        f"{s.caller}#{s.seq} {s.kind}{list(s.resources)} "
        f"[{s.acquired:.4f}, {s.end:.4f}] fences={dict(s.fences)}"
    )


def read_journals(directory: Path) -> tuple[list[Section], list[dict[str, Any]]]:
    """Every section recorded under ``directory``, and the other records (holding, failures)."""
    sections, others = [], []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by kill -9 mid-write
            if record.get("type") == "section":
                sections.append(Section.from_record(record))
            else:
                others.append(record)
    return sections, others


def killed_holders(
    others: Iterable[Mapping[str, Any]], sections: Sequence[Section]
) -> list[Section]:
    """A process killed while holding left a ``holding`` line and no section line: its lease is
    held until its validity ran out, and it wrote nothing afterwards."""
    finished = {(s.caller, s.seq) for s in sections}
    found = []
    for record in others:
        if record.get("type") == "holding" and (record["caller"], record["seq"]) not in finished:
            fields = {k: v for k, v in record.items() if k not in {"type", "pid"}}
            fields.update(released=None, release="killed")
            found.append(Section.from_record(fields))
    return found


def check(
    sections: Sequence[Section],
    *,
    counters: Mapping[str, int],
    accepted: Mapping[str, Sequence[int]],
    limits: Mapping[str, int],
) -> Verdict:
    """Judge one run. ``counters``: each resource's final counter; ``accepted``: the tokens the
    fenced store accepted per resource, in its order; ``limits``: each semaphore's permits. A
    process is killed only while it stands stopped before its counter write (``faults``), so no
    write of a killed process is in doubt."""
    violations: list[Violation] = []
    resources = sorted({r for s in sections for r in s.resources})
    for resource in resources:
        mine = [s for s in sections if resource in s.resources]
        exclusive = [s for s in mine if s.kind in EXCLUSIVE]
        as_intervals = [_interval(s) for s in exclusive]
        for a, b in overlaps(as_intervals):
            violations.append(Violation("exclusive", f"{resource}: {a.note} and {b.note}"))
        stretches = [_stretch(s) for s in mine if s.kind in {"writer", "reader", "permit"}]
        if resource in limits:
            for instant, holders in over_limit(stretches, limits[resource]):
                violations.append(
                    Violation("permits", f"{resource}: {holders} valid at {instant:.4f}")
                )
        for writer, other in beside_writer([s for s in stretches if s.kind != "permit"]):
            violations.append(
                Violation(
                    "readers",
                    f"{resource}: writer [{writer.acquired:.4f}, {writer.end:.4f}] beside "
                    f"{other.kind} [{other.acquired:.4f}, {other.end:.4f}]",
                )
            )
        fenced = sorted((s for s in exclusive if resource in s.fences), key=lambda s: s.acquired)
        for a, b in zip(fenced, fenced[1:], strict=False):
            if b.fences[resource] <= a.fences[resource]:
                violations.append(
                    Violation("fences", f"{resource}: {describe(a)} then {describe(b)}")
                )
        log = list(accepted.get(resource, ()))
        for x, y in zip(log, log[1:], strict=False):
            if y <= x:
                violations.append(Violation("fences", f"{resource}: store accepted {x} then {y}"))
        counted = sum(resource in s.counted for s in exclusive)
        final = counters.get(resource, 0)
        if final != counted:
            violations.append(
                Violation("counter", f"{resource}: {counted} sections wrote it, it ends at {final}")
            )
    for s in sections:
        if s.owned is None or not s.owned[2]:
            continue
        asked, answered, _ = s.owned
        for other in sections:
            # Said "a quorum holds our lease" while another exclusive holder of one of its
            # resources was valid for the whole question: two quorums at once.
            if (
                other is not s
                and other.kind in EXCLUSIVE
                and s.kind in EXCLUSIVE
                and set(other.resources) & set(s.resources)
                and other.acquired < asked
                and answered < other.end
            ):
                violations.append(
                    Violation("owned", f"{describe(s)} owned() said ours beside {describe(other)}")
                )
    for s in sections:
        if s.released is None:
            continue
        outlived = s.released > s.renewed + s.ttl + EXPIRY_SLACK
        if s.release == "ok" and outlived and not s.auto_extend:
            violations.append(
                Violation(
                    "release",
                    f"{describe(s)} released {s.released - s.renewed:.3f}s after its last "
                    f"grant/renewal (ttl {s.ttl}) and was told it was confirmed",
                )
            )
    by_kind: dict[str, int] = defaultdict(int)
    for s in sections:
        by_kind[s.kind] += 1
    return Verdict(
        sections=len(sections),
        by_kind=dict(by_kind),
        violations=violations,
        counters={
            r: (sum(r in s.counted for s in sections), counters.get(r, 0)) for r in resources
        },
    )


def _interval(s: Section) -> Interval:
    return Interval(
        worker=s.caller,
        seq=s.seq,
        acquired=s.acquired,
        valid_until=s.valid_until,
        released=s.valid_until if s.released is None else s.released,
        fence=None,
        counted=bool(s.counted),
        fenced=None,
        wrote_at=None,
        note=describe(s),
    )


def _stretch(s: Section) -> Stretch:
    released = s.valid_until if s.released is None else s.released
    return Stretch(kind=s.kind, acquired=s.acquired, valid_until=s.valid_until, released=released)


# --- the Django workload (``django_client``) ------------------------------------------------


def check_django(
    records: Sequence[Mapping[str, Any]],
    ledger: Mapping[str, tuple[int, int]],
    accounts: Mapping[str, tuple[int, int]],
) -> list[Violation]:
    """Judge the Django workload's records against the rows as they ended: ``ledger`` (row name
    to its value and its committed increments, counted by the log rows each increment writes in
    its own transaction) and ``accounts`` (owner to balance and fence).

    - **counter**: each ledger row ends equal to the increments that committed; and every
      increment its caller was told succeeded (a 200, an ``atomic`` that returned) committed;
    - **fences**: each account's balance equals the fenced updates that wrote it (``F()``: the
      count is exact), its fence is the highest token that wrote it (it never went back), and no
      update was written with a token lower than one already committed before it started."""
    violations: list[Violation] = []
    for row, (value, committed) in sorted(ledger.items()):
        told = sum(
            1 for r in records if r.get("row") == row and r["kind"] != "fenced" and r["counted"]
        )
        if value != committed:
            violations.append(
                Violation(
                    "counter", f"ledger {row}: {committed} increments committed, it ends at {value}"
                )
            )
        if told > committed:
            violations.append(
                Violation("counter", f"ledger {row}: {told} told they committed, {committed} did")
            )
    for owner, (balance, fence) in sorted(accounts.items()):
        wrote = [
            r for r in records if r["kind"] == "fenced" and r.get("owner") == owner and r["counted"]
        ]
        if balance != len(wrote):
            violations.append(
                Violation(
                    "fences", f"account {owner}: {len(wrote)} fenced writes, balance {balance}"
                )
            )
        highest = max((r["token"] for r in wrote), default=0)
        if fence != highest:
            violations.append(
                Violation(
                    "fences", f"account {owner}: fence {fence}, highest token written {highest}"
                )
            )
        for late in wrote:
            for early in wrote:
                if early["committed"] < late["started"] and early["token"] > late["token"]:
                    violations.append(
                        Violation(
                            "fences",
                            f"account {owner}: token {late['token']} wrote after token "
                            f"{early['token']} had committed",
                        )
                    )
    return violations
