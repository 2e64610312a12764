"""What the engine keeps per event loop (an admission gate, the deadlines' timer, a write
flusher): made on a loop's first use, and dropped once that loop has closed. Not a weak
dictionary: its values hold their loop (through futures and callbacks), so a weak key would never
die."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def of_loop(
    table: dict[asyncio.AbstractEventLoop, T],
    loop: asyncio.AbstractEventLoop,
    make: Callable[[asyncio.AbstractEventLoop], T],
) -> T:
    """``table``'s entry for ``loop``, made by ``make(loop)`` on its first use; a new entry first
    drops those of loops that closed (``asyncio.run`` returned). Another thread may sweep the
    same table meanwhile: a loop already dropped is left alone."""
    found = table.get(loop)
    if found is None:
        for closed in [each for each in table if each.is_closed()]:
            table.pop(closed, None)
        found = table[loop] = make(loop)
    return found
