"""The parent's side of ``bench/worker.py``: start a worker in the right virtual environment, talk
to it in JSON lines, and make the redlock-ng environment on demand.

redlock-ng installs a top-level module ``redlock``, as redlock-py does, so the two cannot share
``.venv``. Its own environment, ``bench/.venv-redlock-ng`` (git-ignored), is made the first time
a benchmark needs it, with ``python -m venv`` and ``pip install redlock-ng hiredis`` from PyPI
(hiredis: the same reply parser the other rows use, so the comparison is about the lock library).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .peers import Batch

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORKER = BENCH / "worker.py"
#: Many callers in one process (scenarios f and g), run by path like ``worker.py``.
CROWD = BENCH / "crowd.py"
NG_VENV = BENCH / ".venv-redlock-ng"
NG_REQUIREMENTS = ("redlock-ng", "hiredis")

#: Worker implementations that need the redlock-ng environment.
NG_IMPLEMENTATIONS = ("redlock-ng", "redlock-ng-async")


class Unavailable(Exception):
    """A worker's environment could not be made (no PyPI, pip failed): its rows say why."""


@functools.cache
def ng_python() -> str:
    """The redlock-ng environment's python, made and installed on first use."""
    python = NG_VENV / "bin" / "python"
    probe = [str(python), "-c", "import redlock, hiredis; redlock.AsyncRedlock"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(python)
    print(
        f"(making {NG_VENV.relative_to(REPO)} for redlock-ng: python -m venv + pip install "
        f"{' '.join(NG_REQUIREMENTS)})",
        flush=True,
    )
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(NG_VENV)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *NG_REQUIREMENTS,
        ],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            raise Unavailable(f"{' '.join(step[:4])} failed: {done.stderr.strip()[-300:]}")
    if subprocess.run(probe, capture_output=True).returncode != 0:
        raise Unavailable("redlock-ng installed but does not import")
    return str(python)


def python_for(implementation: str) -> str:
    return ng_python() if implementation in NG_IMPLEMENTATIONS else sys.executable


def ng_version() -> str:
    """redlock-ng's installed version, for the environment line ('n/a' if unavailable)."""
    try:
        python = ng_python()
    except Unavailable:
        return "n/a"
    code = "import importlib.metadata as m; print(m.version('redlock-ng'), m.version('redis'))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True).stdout.split()
    return f"{out[0]} (redis-py {out[1]})" if len(out) == 2 else "?"


def spawn(
    mode: str,
    implementation: str,
    config: dict[str, Any],
    script: Path = WORKER,
    code: Path = REPO,
) -> subprocess.Popen[str]:
    """Start ``bench/worker.py <mode> <implementation> <config>`` (or another ``script`` of the
    same shape) in the right environment. ``code`` is on its path: our engine is imported from
    the work tree (not installed), or from a baseline's checkout."""
    env = dict(os.environ, PYTHONPATH=str(code))
    if implementation in NG_IMPLEMENTATIONS:
        env.pop("PYTHONPATH")  # nothing of ours in redlock-ng's process
    return subprocess.Popen(
        [python_for(implementation), str(script), mode, implementation, json.dumps(config)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


@contextlib.contextmanager
def spawned(
    mode: str,
    implementation: str,
    config: dict[str, Any],
    processes: int,
    deadline: float,
    script: Path = WORKER,
    code: Path = REPO,
) -> Iterator[list[subprocess.Popen[str]]]:
    """``processes`` workers of one ``mode`` (``spawn``); on exit their stdin is closed (their
    signal to finish) and each is waited for up to ``deadline`` seconds, then killed."""
    workers: list[subprocess.Popen[str]] = []
    try:
        for _ in range(processes):
            workers.append(spawn(mode, implementation, config, script, code))
        yield workers
    finally:
        for proc in workers:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            try:
                proc.wait(timeout=deadline)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


class Worker:
    """A worker process spoken to in JSON lines: by default a ``serve``-mode ``worker.py`` (one
    request, one answer: ``ask``); other modes and scripts talk with ``send`` and ``read``."""

    def __init__(
        self,
        implementation: str,
        config: dict[str, Any],
        mode: str = "serve",
        script: Path = WORKER,
    ) -> None:
        self.implementation = implementation
        self.proc = spawn(mode, implementation, config, script)

    def ask(self, **request: Any) -> dict[str, Any]:
        self.send(json.dumps(request))
        return self.read()

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def read(self, timeout: float | None = None) -> dict[str, Any]:
        """The worker's next JSON line; ``RuntimeError`` if it exits, says ``error``, or (with
        ``timeout``, seconds) is killed for being silent that long."""
        assert self.proc.stdout is not None
        watchdog = None if timeout is None else threading.Timer(timeout, self.proc.kill)
        if watchdog is not None:
            watchdog.start()
        try:
            line = self.proc.stdout.readline()
        finally:
            if watchdog is not None:
                watchdog.cancel()
        if not line:
            raise RuntimeError(f"worker {self.implementation} exited ({self.proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"worker {self.implementation}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class RemoteContender:
    """A cycle-benchmark contender whose cycles run in a worker process (redlock-ng). The parent
    waits while the worker runs, so rounds interleave with the in-process rows as usual."""

    def __init__(
        self, name: str, meaning: str, implementation: str, config: dict[str, Any]
    ) -> None:
        self.name = name
        self.meaning = meaning
        self.unavailable = ""
        self._worker: Worker | None = None
        try:
            self._worker = Worker(implementation, config)
        except Unavailable as exc:
            self.unavailable = str(exc)

    def run(self, cycles: int) -> Batch:
        if self._worker is None:
            return Batch(errors=[f"not measured: {self.unavailable}"] * cycles)
        answer = self._worker.ask(op="cycles", n=cycles)
        return Batch(times_ns=answer["times_ns"], errors=answer["errors"])

    def close(self) -> None:
        if self._worker is not None:
            self._worker.close()
