"""A child process driven over stdin and stdout, a line each way (the holders of the PostgreSQL
scenarios: tests/stale_writer.py, tests/fence_racer.py, tests/txn_writer.py), that says READY
once it is set up."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

from tests.conftest import ROOT


class LineChild:
    def __init__(self, env: dict[str, str], module: str, *args: str) -> None:
        self.proc = subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=env,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert self.read() == "READY"

    def read(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"child died: {self.proc.communicate(timeout=10)[1]}")
        return line.strip()

    def say(self, words: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(words + "\n")
        self.proc.stdin.flush()

    def ask(self, words: str) -> Any:
        self.say(words)
        return json.loads(self.read())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # (it may be stopped)
            self.proc.kill()
        self.proc.communicate(timeout=10)
