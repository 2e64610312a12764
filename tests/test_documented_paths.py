"""Every import path and package file the documentation names is there: the README, docs/ and
pyproject.toml's comments show ``from django_redlock.x import Y``, dotted names
(``django_redlock.contrib.health_check.Redlock``, a string a project writes in its settings) and
files (``django_redlock/contrib/otel.py``). A module that moves keeps the path it was documented
under as a re-export (issue 37: ``django_redlock.celery``), giving the very objects of the module
it moved to."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from .conftest import printed_ok

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", ROOT / "pyproject.toml", *sorted((ROOT / "docs").glob("*.md"))]
TEXT = "\n".join(path.read_text() for path in DOCUMENTS)

IMPORT = re.compile(r"from (django_redlock[\w.]*) import (?:\(([^)]*)\)|([\w ,]+))")
DOTTED = re.compile(r"django_redlock(?:\.\w+)+")
FILE = re.compile(r"django_redlock/[\w/.]*\w")
CHECK_ID = re.compile(r"\.[EW]\d{3}$")  # ``django_redlock.E001``: a system check's id


def documented_names(text: str) -> list[str]:
    """Each dotted name the text shows, ``from x import a, b`` as ``x.a`` and ``x.b``."""
    names = {name for name in DOTTED.findall(text) if not CHECK_ID.search(name)}
    for module, in_parentheses, on_its_line in IMPORT.findall(text):
        imported = (in_parentheses or on_its_line).split(",")
        names |= {f"{module}.{name.split(' as ')[0].strip()}" for name in imported if name.strip()}
    return sorted(names)


def resolve(dotted: str) -> object:
    """What ``dotted`` names: the longest module of it that is there, then its attributes. A
    module that is there but fails to import (a dependency missing) raises that error."""
    parts = dotted.split(".")
    for length in range(len(parts), 0, -1):
        name = ".".join(parts[:length])
        try:
            found: object = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if not f"{name}.".startswith(f"{error.name}."):  # a dependency it needs is missing
                raise
            continue
        for attribute in parts[length:]:
            found = getattr(found, attribute)
        return found
    raise AssertionError(f"{dotted}: nothing of it imports")


def test_the_documents_name_imports_and_files() -> None:
    """The two lists below are not empty by accident (a regex that stopped matching)."""
    names = documented_names(TEXT)
    assert {
        "django_redlock.celery.RedlockTask",
        "django_redlock.contrib.celery.RedlockTask",
    } <= set(names)
    assert "django_redlock/contrib/otel.py" in FILE.findall(TEXT)


@pytest.mark.parametrize("dotted", documented_names(TEXT))
def test_every_documented_name_imports(dotted: str) -> None:
    assert resolve(dotted) is not None


@pytest.mark.parametrize("path", sorted(set(FILE.findall(TEXT))))
def test_every_documented_file_is_there(path: str) -> None:
    assert (ROOT / path).exists(), f"the docs name {path}, which is not in the tree"


def test_the_check_fails_on_a_path_that_moved_away() -> None:
    assert documented_names("from django_redlock.inventory import list_locks") == [
        "django_redlock.inventory",
        "django_redlock.inventory.list_locks",
    ]
    with pytest.raises(AttributeError, match="inventory"):
        resolve("django_redlock.inventory.list_locks")  # moved to operations/, never documented
    assert not (ROOT / "django_redlock/otel.py").exists()


def test_a_first_path_is_the_module_it_moved_to_not_a_copy() -> None:
    """In a fresh process: the same classes and function whichever path is imported, one module
    that defines them, and Celery's task_revoked receiver connected once."""
    printed_ok(
        "import sys\n"
        "import django_redlock.celery as first\n"
        "import django_redlock.metrics as first_metrics\n"
        "from django_redlock.contrib import celery as moved, prometheus\n"
        "from celery.signals import task_revoked\n"
        "assert first.RedlockTask is moved.RedlockTask, first.RedlockTask\n"
        "assert first.AlreadyQueued is moved.AlreadyQueued\n"
        "assert first_metrics.enabled is prometheus.enabled\n"
        "defining = [m for m in list(sys.modules.values()) if hasattr(m, '_free_revoked')]\n"
        "assert defining == [moved], defining\n"
        "ours = [r for r in task_revoked.receivers if r[0][0] == 'django_redlock.celery']\n"
        "assert len(ours) == 1, task_revoked.receivers\n"
        "print('ok')\n"
    )


@pytest.mark.parametrize(
    ("first", "moved"),
    [
        ("django_redlock.celery", "django_redlock.contrib.celery"),
        ("django_redlock.metrics", "django_redlock.contrib.prometheus"),
    ],
)
def test_a_first_path_gives_each_name_it_exports_from_the_new_one(first: str, moved: str) -> None:
    old, new = importlib.import_module(first), importlib.import_module(moved)
    assert old.__all__
    for name in old.__all__:
        assert getattr(old, name) is getattr(new, name), name
