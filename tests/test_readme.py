"""The README's and the docs' examples run as written (one of them used to fail at import:
``atomic=`` on an async view), and the README keeps what a newcomer needs on its first screens."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def python_block(page: str, containing: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.DOTALL)
    [block] = [b for b in blocks if containing in b]
    return block


@pytest.mark.parametrize(
    ("page", "containing"),
    [
        ("docs/views.md", "from django_redlock import lock_view"),
        ("docs/commands.md", "class Command(GuardedCommandMixin"),
        ("docs/api.md", "from django_redlock import locked"),
    ],
)
def test_example_runs_as_written(page: str, containing: str) -> None:
    namespace: dict[str, object] = {}
    exec(compile(python_block(page, containing), page, "exec"), namespace)  # noqa: S102
    assert callable(namespace.get("pay") or namespace.get("Command") or namespace.get("transfer"))


def test_the_docs_say_to_migrate_and_document_the_mixin_attributes() -> None:
    assert "python manage.py migrate" in (ROOT / "docs/configuration.md").read_text()
    commands = (ROOT / "docs/commands.md").read_text()
    assert "`lock_key` names the lock" in commands
    assert "`lock_wait` is how long" in commands


def test_the_readme_is_short_and_starts_with_what_a_newcomer_needs() -> None:
    """Was 622 lines, with no install line and the two commands below the fold."""
    lines = README.splitlines()
    assert len(lines) <= 250
    top = "\n".join(lines[:15])
    assert "pip install django-redlock" in top
    assert "Python 3.11" in top
    assert "Django 5.2" in top
    assert "pip install -q -e '.[demo]' && .venv/bin/python manage.py demo" in README
    for peer in ("pottery", "redlock-py", "aioredlock"):
        assert peer in README


def test_every_docs_page_the_readme_links_exists() -> None:
    for target in re.findall(r"\]\((docs/[^)#]+)", README):
        assert (ROOT / target).is_file(), target
