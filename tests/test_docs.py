"""The documentation (docs/, mkdocs.yml) builds with no warning: a broken link, a missing anchor or
a page left out of the nav fails the suite, and so CI (``mkdocs build --strict``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_docs_build_strict(tmp_path: Path) -> None:
    result = build(ROOT, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "site" / "migrating" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    """The build above would pass a warning silently without --strict: check that it does not."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "views.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    result = build(tmp_path, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr
