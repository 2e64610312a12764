"""Scenario (c): contention. 8 processes x 25 blocking acquisitions of one resource, each held
2 ms, on 5 local masters (single-node locks: on the first one).

Every implementation that can block (or retry) gets its own 8 worker processes (``worker.py
contend``), started and warmed up (connections open, scripts loaded) before one ``go`` line
releases them all at once. Implementations take turns, in rounds, the order rotated each round.

Measured from the workers' monotonic timelines (``CLOCK_MONOTONIC`` is shared by all processes):

- efficiency = ideal hold time (acquisitions x 2 ms) / wall time (first attempt to last release):
  1.0 means the lock was never idle while someone wanted it;
- wait: from asking for the lock to holding it, per acquisition (p50, p99, max);
- overlaps: pairs of holds by different workers that overlap in time (must be 0: a lock that
  lets two holders in at once is broken, however fast it is).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django_redlock.testing.masters import LocalMaster, local_masters

from . import report
from .remote import Unavailable, spawned

PROCESSES = 8
ACQUISITIONS = 25
HOLD = 0.002
TTL = 10.0
#: A worker that has not reported this long after ``go`` is stuck: its row says so.
DEADLINE = 120.0

#: (row label, worker implementation, masters used, how it waits)
IMPLEMENTATIONS = [
    (
        "ours (sync)",
        "ours",
        "5",
        "lock(r, wait=60).acquire(): waiters queue on the masters; a release hands the lock to "
        "the head of the queue and tells it alone, through its process's inbox",
    ),
    (
        "ours (sync, cold)",
        "ours",
        "5",
        "the same, in worker processes that were not warmed up: each one's first acquisition "
        "opens its connections",
    ),
    (
        "ours (redlock())",
        "ours-django",
        "5",
        "redlock(r, wait=60).acquire() through settings.REDLOCK (the Django observer: signals, "
        "metrics; the DB guard), as a Django worker calls it; waits as above",
    ),
    (
        "ours (redlock(), cold)",
        "ours-django",
        "5",
        "the same, worker processes not warmed up",
    ),
    (
        "ours (redlock(), 1 master)",
        "ours-django",
        "1",
        "the same, NODES with one master: like for like with the single-node peers below",
    ),
    ("pottery", "pottery", "5", "acquire(): retries after a random 0-200 ms"),
    ("redlock-py", "redlock-py", "5", "lock() until it returns a lock: 3 tries 200 ms apart each"),
    ("redlock-ng", "redlock-ng", "5", "acquire(blocking=True): retries after 100-300 ms"),
    (
        "single: python-redis-lock",
        "python-redis-lock",
        "1",
        "acquire(): BLPOP on a signal list that the release pushes to",
    ),
    ("single: redis-py Lock", "redis-py-lock", "1", "acquire(): polls every 100 ms"),
]


@dataclass
class Race:
    """All acquisitions of one implementation over its rounds."""

    efficiencies: list[float] = field(default_factory=list)
    waits_ns: list[int] = field(default_factory=list)
    overlaps: int = 0
    acquired: int = 0
    errors: list[str] = field(default_factory=list)
    #: Redis commands the masters ran, by name (summed over masters and rounds).
    commands: dict[str, int] = field(default_factory=dict)
    #: Ours: each hand-off's parts in ns (``handoff_parts``), over all rounds.
    handoffs: list[dict[str, int]] = field(default_factory=list)
    #: Each worker's holds, (got, done) in monotonic ns, one list per process (``bench.handoff``).
    holds_by_process: list[list[tuple[int, int]]] = field(default_factory=list)
    #: The race's first attempt and last release, monotonic ns (0 if nothing was reported).
    start: int = 0
    end: int = 0


#: Rows whose workers are not warmed up before the race (``worker.py contend``, ``cold``).
COLD = {"ours (sync, cold)", "ours (redlock(), cold)"}

#: Our rows: their workers record a timeline of each hand-off (``worker.Timeline``).
OURS = ("ours", "ours-django")

#: Commands counted per acquisition: SET (attempts x masters), the scripts that release or undo,
#: and PUBLISH (a release notice per master; counted also when a script calls it).
COUNTED = ("set", "script", "publish")


def reset_stats(masters: Sequence[LocalMaster]) -> None:
    for master in masters:
        client = master.client()
        try:
            client.config_resetstat()
        finally:
            client.close()


def command_counts(masters: Sequence[LocalMaster]) -> dict[str, int]:
    """Calls per counted command since the last ``reset_stats``, summed over ``masters``."""
    counts = dict.fromkeys(COUNTED, 0)
    for master in masters:
        client = master.client()
        try:
            for name, stats in client.info("commandstats").items():
                command = name.removeprefix("cmdstat_")
                command = "script" if command in ("eval", "evalsha") else command
                if command in counts:
                    counts[command] += int(stats["calls"])
        finally:
            client.close()
    return counts


def race(
    implementation: str,
    urls: Sequence[str],
    key: str,
    *,
    processes: int,
    count: int,
    cold: bool = False,
) -> Race:
    """One race: ``processes`` workers, ``count`` acquisitions each, all released by one ``go``;
    ``cold``: workers not warmed up (their first acquisition connects)."""
    config = {"urls": list(urls), "key": key, "ttl": TTL, "count": count, "hold": HOLD}
    config["cold"] = cold
    config["breakdown"] = implementation in OURS
    result = Race()
    with spawned("contend", implementation, config, processes, DEADLINE) as workers:
        for proc in workers:
            assert proc.stdout is not None
            if not json.loads(proc.stdout.readline() or "{}").get("ready"):
                result.errors.append(f"a worker did not start (exit {proc.poll()})")
                return result
        for proc in workers:  # "go" to all, as close together as we can
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        finished = []
        for proc in workers:  # each says it is done, then waits (``worker.contend``)
            assert proc.stdout is not None
            if json.loads(proc.stdout.readline() or "{}").get("done"):
                finished.append(proc)
            else:
                result.errors.append(f"a worker died (exit {proc.poll()})")
        reports = []
        for proc in finished:
            assert proc.stdin is not None
            assert proc.stdout is not None
            proc.stdin.write("report\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if line:
                reports.append(json.loads(line))
            else:
                result.errors.append(f"a worker died (exit {proc.poll()})")
    holds = sorted((got, done) for r in reports for got, done in r["holds"])
    latest_end = 0
    for got, done in holds:  # in order of acquisition: each must begin after all before it ended
        result.overlaps += got < latest_end
        latest_end = max(latest_end, done)
    result.acquired = len(holds)
    result.waits_ns = [w for r in reports for w in r["waits_ns"]]
    for r in reports:
        result.errors.extend(r["errors"])
    result.holds_by_process = [[(got, done) for got, done in r["holds"]] for r in reports]
    if config["breakdown"] and reports:
        result.handoffs = handoff_parts(reports)
    if reports and holds:
        result.start = min(r["start"] for r in reports)
        result.end = max(r["end"] for r in reports)
        wall = result.end - result.start
        result.efficiencies.append(len(holds) * HOLD * 1e9 / wall)
    return result


#: The parts of a hand-off, in the order they follow one another on the critical path (the
#: release round runs beside them: the notice leaves the master while the release is in flight).
PARTS = (
    "release round",
    "notice",
    "wake-up",
    "quorum told",
    "before round",
    "acquire round",
    "after round",
)


def handoff_parts(reports: list[dict[str, Any]]) -> list[dict[str, int]]:
    """Each hand-off from one worker to another, cut into its parts (ns), from the workers'
    timelines on the shared monotonic clock. t0 = the holder starts its release; then

    - ``release round``: the holder's release, t0 to its return (beside the rest);
    - ``notice``: t0 to the next holder's process reading its first release notice (its
      waiting thread itself, since it reads its own notices: ``engine.notices``);
    - ``wake-up``: from there to its wait step returning (for a waiter handed the lock, its
      reader reads on to a quorum's words within that wait: ``ReleaseNotices.wait_notice``);
    - ``quorum told`` (handed over): from there to the end of its last wait for notices, when
      a quorum of masters told it that the release handed it the lock (mostly 0 since
      ``wait_notice``: more only when its thread did not hold the reading turn);
    - ``before round``: from there to its next round's start (local turn, pauses, admission);
    - ``acquire round``: the round that won (none when handed over);
    - ``after round``: from the round's end (handed over: the last wait's end) to ``acquire()``
      returning (lease, observer);
    - ``gap``: t0 to the next holder holding, the sum of the critical path;
    - ``pause``: time the next holder spent in pauses within the gap (courtesy, split retry);
    - ``woken``: 1 if a notice woke it within the gap and a round took the lock, 2 if a notice
      woke it and the release handed it the lock (no round after the notice), 0 if it got
      there another way (its first attempt, a pause, the safety poll): its parts other than
      the gap are then 0.
    """
    holds = sorted(
        (got, done, released, w)
        for w, r in enumerate(reports)
        for (got, done), released in zip(r["holds"], r["released"], strict=True)
    )
    parts: list[dict[str, int]] = []
    for (_, t0, t1, holder), (got, _, _, w) in zip(holds, holds[1:], strict=False):
        if w == holder or got < t0:
            continue
        timeline = reports[w]
        steps = [(k, b, e) for k, b, e in timeline["steps"] if b < got and e > t0]
        part = dict.fromkeys(PARTS, 0) | {"gap": got - t0, "release round": t1 - t0}
        part["pause"] = sum(min(e, got) - max(b, t0) for k, b, e in steps if k == "pause")
        notice = next((n for n in timeline["notices"] if t0 <= n <= got), None)
        waits = [(b, e) for k, b, e in steps if k == "notice" and notice and e >= notice]
        rounds = [(b, e) for k, b, e in steps if k.startswith("round:") and e <= got]
        if notice is not None and waits and not any(b >= waits[0][1] for b, _ in rounds):
            woke, told = waits[0][1], waits[-1][1]
            part |= {
                "woken": 2,
                "notice": notice - t0,
                "wake-up": woke - notice,
                "quorum told": told - woke,
                "after round": got - told,
            }
            parts.append(part)
            continue
        part["woken"] = int(bool(notice and waits and rounds and rounds[-1][0] >= waits[0][1]))
        if part["woken"] and notice is not None:
            woke = waits[0][1]
            start, end = rounds[-1]
            part |= {
                "notice": notice - t0,
                "wake-up": woke - notice,
                "before round": start - woke,
                "acquire round": end - start,
                "after round": got - end,
            }
        parts.append(part)
    return parts


def breakdown_text(label: str, parts: list[dict[str, int]]) -> str:
    """One line per part: mean and p50 over the hand-offs a notice woke; the others apart."""
    handed = [p for p in parts if p["woken"] == 2]
    woken = [p for p in parts if p["woken"] == 1]
    other = [p for p in parts if not p["woken"]]
    if not parts:
        return f"- {label}: no hand-off recorded"

    def ms(values: list[int]) -> str:
        if not values:
            return "-"
        return f"{statistics.mean(values) / 1e6:.2f} / {statistics.median(values) / 1e6:.2f}"

    def cells(group: list[dict[str, int]], names: Sequence[str]) -> str:
        return "; ".join(f"{name} {ms([p[name] for p in group])}" for name in names)

    told = ("release round", "notice", "wake-up", "quorum told", "after round", "gap")
    line = (
        f"- {label}: {len(handed)} of {len(parts)} hand-offs handed over by the release "
        f"(no round of its own), ms mean / p50: {cells(handed, told)}. {len(woken)} woken by a "
        f"notice, then a round: {cells(woken, (*PARTS, 'pause', 'gap'))}"
    )
    if other:
        line += (
            f". The other {len(other)}: gap {ms([p['gap'] for p in other])}, of it in pauses "
            f"{ms([p['pause'] for p in other])}"
        )
    return line


def run(
    *,
    rounds: int = 2,
    processes: int = PROCESSES,
    count: int = ACQUISITIONS,
    only: Sequence[str] = (),
) -> tuple[str, dict[str, Any]]:
    """Markdown and data for scenario (c); ``only``: the rows whose label contains one of these
    (all rows if empty)."""
    started = time.monotonic()
    implementations = [
        row for row in IMPLEMENTATIONS if not only or any(word in row[0] for word in only)
    ]
    races = {label: Race() for label, *_ in implementations}
    with local_masters(5) as masters:
        urls = [m.url for m in masters]
        for r in range(rounds):
            shift = r % len(implementations)
            for label, implementation, used, _ in [
                *implementations[shift:],
                *implementations[:shift],
            ]:
                targets = urls if used == "5" else urls[:1]
                cold = label in COLD
                reset_stats(masters)
                try:
                    one = race(
                        implementation,
                        targets,
                        f"bench:contend:{implementation}:{'cold' if cold else 'warm'}:{r}",
                        processes=processes,
                        count=count,
                        cold=cold,
                    )
                except Unavailable as exc:
                    one = Race(errors=[f"not measured: {exc}"])
                total = races[label]
                total.efficiencies += one.efficiencies
                total.waits_ns += one.waits_ns
                total.overlaps += one.overlaps
                total.acquired += one.acquired
                total.errors += one.errors
                total.handoffs += one.handoffs
                for command, calls in command_counts(masters).items():
                    total.commands[command] = total.commands.get(command, 0) + calls
    took = time.monotonic() - started

    data: dict[str, Any] = {"scenario": "c", "environment": report.environment(), "rows": {}}
    for label, race_ in races.items():
        waits = sorted(race_.waits_ns)
        data["rows"][label] = {
            "efficiency": statistics.median(race_.efficiencies) if race_.efficiencies else math.nan,
            "efficiency_runs": race_.efficiencies,
            "wait_p50_ms": report.percentile_ms(waits, 0.50),
            "wait_p99_ms": report.percentile_ms(waits, 0.99),
            "wait_max_ms": report.percentile_ms(waits, 1.0),
            "acquired": race_.acquired,
            "overlaps": race_.overlaps,
            "commands_per_acquisition": {
                c: n / race_.acquired for c, n in race_.commands.items() if race_.acquired
            },
            "errors": race_.errors[:1],
            "handoffs": race_.handoffs,
        }
    rows_data = data["rows"]
    best_eff = report.best_peer(rows_data, "efficiency", highest=True)
    best = {
        k: report.best_peer(rows_data, k) for k in ("wait_p50_ms", "wait_p99_ms", "wait_max_ms")
    }
    rows = []
    for label, _, used, how in implementations:
        d = rows_data[label]
        runs = ", ".join(f"{e:.2f}" for e in d["efficiency_runs"])
        rows.append(
            [
                label,
                used,
                report.with_ratio(d["efficiency"], best_eff, 2) + (f" [{runs}]" if runs else ""),
                report.with_ratio(d["wait_p50_ms"], best["wait_p50_ms"], 1),
                report.with_ratio(d["wait_p99_ms"], best["wait_p99_ms"], 1),
                report.with_ratio(d["wait_max_ms"], best["wait_max_ms"], 1),
                f"{d['acquired']}/{rounds * processes * count}",
                str(d["overlaps"]),
                " / ".join(
                    report.number(d["commands_per_acquisition"].get(c, math.nan), 1)
                    for c in COUNTED
                ),
                how + (f" ({d['errors'][0]})" if d["errors"] else ""),
            ]
        )
    headers = ["implementation", "masters", "efficiency [per round]", "wait p50 ms"]
    headers += ["wait p99 ms", "wait max ms", "acquired", "overlaps"]
    headers += ["per acquisition: SET / scripts / PUBLISH", "how it waits"]
    text = "\n".join(
        [
            "## (c) Contention: "
            f"{processes} processes x {count} acquisitions of one key, each held "
            f"{HOLD * 1000:.0f} ms",
            "",
            f"{data['environment']}. {rounds} rounds, order rotated each round; worker processes "
            f"started and warm before one 'go'. Efficiency = {processes * count} x "
            f"{HOLD * 1000:.0f} ms / wall time (median of the rounds; each round in brackets); "
            "waits over all rounds. No floor here: ratios are to the best peer (ours excluded) "
            "for that column. Per acquisition: commands the masters ran, summed over the masters "
            "(a 5-master attempt is 5 SETs; worker warm-ups included). 'cold': worker processes "
            "not warmed up, their first acquisition (connects, script loading) in the race. "
            "Targets for ours (issue 10): efficiency >= 0.7, max wait <= 100 ms, cold too. "
            f"Took {took:.1f} s.",
            "",
            report.table(headers, rows),
            "",
            "Our hand-offs, cut into their parts (`handoff_parts`): t0 = the holder starts its "
            "release; the release round runs beside the rest; then the notice read by the next "
            "holder's waiting thread, its wait step returning (the reader reads on to a quorum's "
            "words within it); handed over: until a quorum of masters told it the release "
            "handed it the lock (if a further wait was needed), then to holding (lease, observer); "
            "otherwise until its next round starts (local turn, pauses), the round that won, and "
            "from there to holding. gap = t0 to holding; pause = pauses inside the gap.",
            "",
            *(
                breakdown_text(label, rows_data[label]["handoffs"])
                for label, implementation, _, _ in implementations
                if implementation in OURS
            ),
        ]
    )
    return text, data
