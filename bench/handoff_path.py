"""``python -m bench.handoff_path``: one hand-off's critical path, step by step, and its
bytecodes on each side. Not part of ``all``: it prints, it saves nothing.

P worker processes (default 8) take one key in turn through ``redlock()`` with Django settings
on N local masters (default 5), each holding it 2 ms, as scenario (c) does. Each process notes,
on the shared monotonic clock: its ``release()`` call, each request its pipes write, each
inbox read (``poll()`` returned), each master's word delivered, its wait for a notice returning,
and holding the lock. Per hand-off (the next holder's events after the previous holder's
``release()``), the table gives p50 and mean of each point, from the release.

Then one hand-off is traced on each side (``sys.settrace`` with opcode events): the bytecodes
the waiter runs from reading the first word to holding, and those the releaser runs from
``release()`` to the write that reaches the quorum-th master. On a busy 2-CPU machine the code
after a 2 ms sleep runs with cold caches (~120 ns a bytecode against ~35 warm), so these counts
are what the gap's CPU part is made of, and they do not move with the machine's load.

``--baseline DIR`` runs the same in DIR (``git archive <rev> | tar -x -C DIR``) on the same
masters, the timed races of the two trees alternating (``--pairs``, default 2: this, baseline,
baseline, this, ...): whichever runs first after the masters start was measured 20-40 us slower
at every point, the same code on both sides.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

HOLD = 0.002
POINTS = ("first write", "quorum write", "first read", "first word", "quorum word", "wait end")


def worker(config: dict[str, Any]) -> None:
    """One contending process: events (name, monotonic ns) and, if asked, one traced side."""
    import django
    from django.conf import settings

    settings.configure(
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        INSTALLED_APPS=["django_redlock"],
        REDLOCK={"NODES": config["urls"], "NODE_TIMEOUT": 0.05},
    )
    django.setup()
    from django_redlock import redlock
    from django_redlock.engine.members import pipes
    from django_redlock.engine.waiting import inboxes, notices

    events: list[tuple[str, int]] = []
    clock = time.monotonic_ns

    def noted(owner: Any, name: str, event: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            events.append((event, clock()))
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)

    noted(pipes.Pipe, "write", "write")
    noted(inboxes.Inbox, "messages", "read")
    noted(notices.ReleaseNotices, "deliver", "word")
    # (The code before this stop waited for a notice with ``wait``: a baseline may.)
    name = "wait_notice" if hasattr(notices.ReleaseNotices, "wait_notice") else "wait"
    wait = getattr(notices.ReleaseNotices, name)

    def timed_wait(*args: Any, **kwargs: Any) -> Any:
        try:
            return wait(*args, **kwargs)
        finally:
            events.append(("wait end", clock()))

    setattr(notices.ReleaseNotices, name, timed_wait)
    traced_at = set(config["traced_at"])
    here = __file__
    count = [0]  # bytecodes run so far in the traced call
    #: (acquisition, inbox read | write | end, monotonic ns, bytecodes so far in it)
    marks: list[tuple[int, str, int, int]] = []
    at = [0]  # the acquisition being traced

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            count[0] += 1
            return tracer
        code = frame.f_code
        if code.co_filename == here:
            return None  # this probe's wrappers: not the library's bytecodes
        if event == "call":
            frame.f_trace_opcodes = True
            if code.co_name == "messages":
                marks.append((at[0], "read", clock(), count[0]))
            elif code.co_name == "write":
                marks.append((at[0], "write", clock(), count[0]))
        return tracer

    # The waiter's side is traced from its first inbox read on: traced from ``acquire()``, its
    # attempt ran ~50x slower and mostly took the lock by its own round after the release, so
    # that few traced acquisitions were hand-offs at all.
    armed = [False]
    read = inboxes.Inbox.messages

    def arming(*args: Any, **kwargs: Any) -> Any:
        # (The waiting thread's own read only: where the keeper thread reads for it, this
        # acquisition is not counted.)
        if armed[0] and threading.current_thread() is threading.main_thread():
            armed[0] = False
            frame: Any = sys._getframe(1)
            while frame is not None:  # the frames already running count from here on too
                if frame.f_code.co_filename != here:
                    frame.f_trace, frame.f_trace_opcodes = tracer, True
                frame = frame.f_back
            sys.settrace(tracer)
        return read(*args, **kwargs)

    inboxes.Inbox.messages = arming  # type: ignore[method-assign]

    for n in range(3):
        with redlock(f"warm-up:{os.getpid()}:{n}", ttl=10):
            pass
    print(json.dumps({"ready": True}), flush=True)
    # "go", or "go <side>" for the one worker that traces (the others run at full speed: a
    # traced process runs ~50x slower, and two of them would seldom hand the lock over).
    side = (sys.stdin.readline().split() + ["-"])[1]
    events.clear()
    for n in range(config["rounds"]):
        lock = redlock("handoff-path", ttl=10, wait=60)
        at[0], count[0] = n, 0
        armed[0] = n in traced_at and side == "waiter"
        lock.acquire()
        armed[0] = False
        sys.settrace(None)
        events.append(("hold", clock()))
        time.sleep(HOLD)
        events.append(("release", clock()))
        if n in traced_at and side == "releaser":
            sys.settrace(tracer)
        lock.release()
        sys.settrace(None)
        if n in traced_at and side != "-":
            marks.append((n, "end", clock(), count[0]))
    print(json.dumps({"events": events, "marks": marks}), flush=True)


def counted(marks: list[list[Any]], side: str, quorum: int, t0: int | None) -> int | None:
    """Bytecodes of one traced acquisition's critical path: the waiter's from its first inbox
    read after the holder's release (``t0``) to holding, the releaser's from ``release()`` to its
    quorum-th write. None if it was not handed over (the tracing slows a process ~50x: its round
    may have met the release first)."""
    if not marks or marks[-1][1] != "end":
        return None
    end = marks[-1][3]
    if side == "waiter":
        reads = [n for _, kind, at, n in marks if kind == "read" and t0 is not None and at >= t0]
        return end - reads[0] if reads else None
    writes = [n for _, kind, _, n in marks if kind == "write"]
    return writes[quorum - 1] if len(writes) >= quorum else None


def race(repo: Path, urls: list[str], processes: int, rounds: int, trace: str) -> dict[str, Any]:
    """One race in ``repo``'s code; its workers' timelines merged into hand-offs. ``trace``:
    which side the first worker traces (``waiter``, ``releaser``, or ``-``: none)."""
    from bench.remote import spawned  # (the parent's only: a worker runs this file by path)

    #: The traced acquisitions: every tenth after the first ten.
    traced_at = list(range(10, rounds - 5, 10))
    config = {"urls": urls, "rounds": rounds, "traced_at": traced_at}
    # (This file by path, with ``repo`` on the path: a baseline's checkout may not have it.)
    with spawned("worker", "ours", config, processes, 30.0, Path(__file__), repo) as workers:
        for w in workers:
            assert w.stdout is not None
            json.loads(w.stdout.readline())
        for i, w in enumerate(workers):
            assert w.stdin is not None
            w.stdin.write(f"go {trace}\n" if i == 0 else "go\n")
            w.stdin.flush()
        reports = []
        for w in workers:
            assert w.stdout is not None
            reports.append(json.loads(w.stdout.readline()))
    quorum = len(urls) // 2 + 1
    releases = sorted(
        (t, i) for i, r in enumerate(reports) for e, t in r["events"] if e == "release"
    )
    parts: dict[str, list[int]] = {p: [] for p in (*POINTS, "holding")}
    for i, report in enumerate(reports):
        events = report["events"]
        for j, (event, at) in enumerate(events):
            if event != "hold":
                continue
            before = [(t, k) for t, k in releases if t < at]
            if not before or before[-1][1] == i:
                continue  # its own first hold, or not a hand-off from another process
            t0, k = before[-1]
            theirs = [t for e, t in reports[k]["events"] if e == "write" and t >= t0]
            mine = events[: j + 1]
            words = [t for e, t in mine if e == "word" and t >= t0]
            reads = [t for e, t in mine if e == "read" and t >= t0]
            ends = [t for e, t in mine if e == "wait end" and t >= t0]
            if len(theirs) < quorum or len(words) < quorum or not reads or not ends:
                continue  # not handed over by the release (a round of its own)
            points = (theirs[0], theirs[quorum - 1], reads[0], words[0], words[quorum - 1], ends[0])
            for name, point in zip(POINTS, points, strict=True):
                parts[name].append(point - t0)
            parts["holding"].append(at - t0)
    traced = None
    if trace != "-":
        holds = [t for e, t in reports[0]["events"] if e == "hold"]
        counts = []
        for n in traced_at:
            # Each traced acquisition's hold, and the other's release just before it.
            held = holds[n] if len(holds) > n else None
            preceding = [t for t, k in releases if k != 0 and held is not None and t < held]
            its_marks = [m for m in reports[0]["marks"] if m[0] == n]
            count = counted(its_marks, trace, quorum, preceding[-1] if preceding else None)
            if count is not None:
                counts.append(count)
        traced = (int(statistics.median(counts)), len(counts)) if counts else None
    return {"parts": parts, "traced": traced}


def table(name: str, runs: list[dict[str, Any]]) -> list[str]:
    parts = runs[0]["parts"]
    lines = [f"{name}: {len(parts['holding'])} hand-offs timed (after the holder's release(), us)"]
    for point, values in parts.items():
        if values:
            p50, mean = statistics.median(values) / 1e3, statistics.mean(values) / 1e3
            lines.append(f"  {point:14s} p50 {p50:7.0f}  mean {mean:7.0f}")

    def median(traced: tuple[int, int] | None) -> str:
        return "-" if traced is None else f"{traced[0]:,} (median of {traced[1]} hand-offs)"

    lines.append(
        f"  bytecodes: waiter, first inbox read -> holding: {median(runs[1]['traced'])}; "
        f"releaser, release() -> the quorum-th write: {median(runs[2]['traced'])}"
    )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--masters", type=int, default=5)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--baseline", type=Path, default=None)
    parser.add_argument("--pairs", type=int, default=2, help="timed races per tree")
    args = parser.parse_args()
    from django_redlock.testing import local_masters

    here = Path(__file__).resolve().parent.parent
    trees = [("this tree", here)] + ([("baseline", args.baseline)] if args.baseline else [])
    with local_masters(args.masters) as masters:
        urls = [m.url for m in masters]
        timed: dict[Path, dict[str, list[int]]] = {repo: {} for _, repo in trees}
        for i in range(args.pairs):  # (the order turned each time: neither always runs first)
            for _, repo in trees if i % 2 == 0 else trees[::-1]:
                parts = race(repo, urls, args.processes, args.rounds, "-")["parts"]
                for point, values in parts.items():
                    timed[repo].setdefault(point, []).extend(values)
        for name, repo in trees:
            runs = [
                {"parts": timed[repo]},
                # (Three processes: with two, the traced one, back from its courtesy pause,
                # now and then found the key free and took it without waiting.)
                race(repo, urls, 3, 60, "waiter"),
                race(repo, urls, 3, 60, "releaser"),
            ]
            print("\n".join(table(f"{name} ({repo})", runs)), flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:  # (``remote.spawn``'s: worker <implementation> <config>)
        worker(json.loads(sys.argv[3]))
    else:
        main()
