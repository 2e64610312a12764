"""Text from the masters, made safe to show: a terminal or a page never gets a raw control byte.

Resource names may come from request data (a URL kwarg can carry ESC, CR or a newline) and keys
under the prefix may be anything. Printed raw, ESC sequences rewrite an operator's terminal and a
CR hides what came before it; so every name, owner and reason is shown through ``printable``.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with each non-printable character (controls, lone surrogates, line and paragraph
    separators...) written as its Python escape: ``"a\\x1b[2Jb\\n"`` shows as ``a\\x1b[2Jb\\n``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
