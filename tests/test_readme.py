"""The README's Django examples run as written (one of them used to fail at import: ``atomic=``
on an async view)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def python_block(containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README, flags=re.DOTALL)
    [block] = [b for b in blocks if containing in b]
    return block


@pytest.mark.parametrize(
    "containing",
    [
        "from django_redlock import lock_view",
        "class Command(GuardedCommandMixin",
        "from django_redlock import locked",
    ],
)
def test_example_runs_as_written(containing):
    namespace: dict[str, object] = {}
    exec(compile(python_block(containing), "README.md", "exec"), namespace)  # noqa: S102
    assert callable(namespace.get("pay") or namespace.get("Command") or namespace.get("transfer"))


def test_the_readme_says_to_migrate_and_documents_the_mixin_attributes():
    assert "python manage.py migrate" in README
    assert "`lock_key` names the lock" in README
    assert "`lock_wait` is how long" in README
