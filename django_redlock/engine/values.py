"""What we store on each master as the lock's value: an unguessable token, then who holds it.

``<32 hex token>:{"host":..,"pid":..,"thread":..,"task":..,"label":..,"ttl":..,"since":<unix>}``

The token (16 bytes from ``secrets``) is what compare-and-delete and compare-and-extend check; the
JSON after it is for humans (the admin page, ``redlock_status``) and names the thread, and the
asyncio task if any, that holds the lock now.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import threading
import time

_HOST = socket.gethostname()

#: Everything of the owner JSON but "since", by (process, thread name, task name, label, ttl):
#: JSON-encoding it on every acquisition cost more than the rest of building the value. Keyed by
#: names, not thread ids (Python reuses those): a lock taken in a new thread names that thread.
_OWNER_JSON: dict[tuple[int, str, str | None, str | None, float], str] = {}
_OWNER_JSON_MAX = 1024  # bounded: threads and tasks come and go


def make_value(label: str | None, ttl: float) -> str:
    """A fresh value for one acquisition by the current thread (and task)."""
    task = None
    loop = asyncio._get_running_loop()  # noqa: SLF001 (public in asyncio's namespace)
    if loop is not None:
        current = asyncio.current_task(loop)
        task = None if current is None else current.get_name()
    thread = threading.current_thread().name
    who = (os.getpid(), thread, task, label, ttl)
    owner_json = _OWNER_JSON.get(who)
    if owner_json is None:
        fields = {
            "host": _HOST,
            "pid": who[0],
            "thread": thread,
            "task": task,
            "label": label,
            "ttl": ttl,
        }
        # Everything but the closing brace: "since" changes with every acquisition.
        owner_json = json.dumps(fields, separators=(",", ":"))[:-1]
        if len(_OWNER_JSON) >= _OWNER_JSON_MAX:
            _OWNER_JSON.clear()
        _OWNER_JSON[who] = owner_json
    since = f"{time.time():.3f}"  # wall clock, for display only
    return f'{secrets.token_hex(16)}:{owner_json},"since":{since}}}'


#: The owner JSON is read back only up to this size (a hostile or foreign value is not parsed).
MAX_OWNER_BYTES = 4096


def owner_of(value: bytes | str) -> dict[str, object] | None:
    """The owner part of a lock value as a dict, or None if the value is not one of ours (no
    token, not JSON, too large, too deep, not an object)."""
    raw = value.encode() if isinstance(value, str) else value
    token, sep, owner = raw.partition(b":")
    if not sep or len(token) != 32 or len(owner) > MAX_OWNER_BYTES:
        return None
    try:
        parsed = json.loads(owner)
    except (ValueError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None
