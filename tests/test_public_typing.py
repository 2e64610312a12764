"""The public names type user code as they did: ``mypy --strict`` on ``typed_user_code.py``
(callbacks, observers and receivers naming the lock as ``Lock``, and what must be refused)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_user_code_typed_with_lock_checks_under_mypy_strict(tmp_path: Path) -> None:
    checked = subprocess.run(  # noqa: S603
        [
            sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
            "--cache-dir", str(tmp_path), str(ROOT / "tests" / "typed_user_code.py"),
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Success: no issues found in 1 source file" in checked.stdout
