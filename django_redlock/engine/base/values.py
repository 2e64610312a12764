"""What we store on each master as the lock's value: an unguessable token, then who holds it;
written (``make_value``) and read back (``parse_value``) here only.

``<32 hex token>:{"host":..,"pid":..,"thread":..,"task":..,"label":..,"ttl":..,"since":<unix>}``,
``task`` and ``label`` only when there is one (a reader takes a missing field as none): every
byte of it is kept by the client per held lock and on every master.

A lock whose body ended before its ``at_least`` is kept under the same token with one more field,
``"until":<unix>`` (``finished_value``): it is finished, and held until then by nobody's renewal.
A lock taken inside a database transaction (the Django layer's, released when that transaction
ends) says so with ``"txn":true`` (``transaction_value``).

The token (16 bytes from the OS's CSPRNG: ``os.urandom``, what ``secrets`` gives) is what
compare-and-delete and compare-and-extend check; the JSON after it is for humans (the admin page,
``redlock_status``) and names the thread, and the asyncio task if any, that holds the lock now.

Anything else can sit under the key prefix too: another program's keys, a value cut short, or one
built to hurt the reader (megabytes, JSON nested thousands deep). ``parse_value`` accepts only our
shape, within ``MAX_VALUE_BYTES`` and one level of nesting, and raises ``UnreadableValue`` saying
why for everything else, so that callers show a row instead of failing. Tokens never leave this
module's callers: a holder is named by its fingerprint (a short sha256).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from . import process

_HOST = socket.gethostname()

#: Longest value we read and parse. Ours are a few hundred bytes (the label is capped); a larger
#: one is not ours, and reading it whole on every page view would let one key slow the admin.
MAX_VALUE_BYTES = 8192
FINGERPRINT_LENGTH = 8
_TOKEN = re.compile(rb"[0-9a-f]{32}")

#: Everything of the owner JSON but "since", by itself: a held lock keeps its value in parts
#: (``compact_value``), and its owner's part is then the one string every lock of that owner
#: shares. (Keyed by the text: a key per owner of its parts was a tuple per task that a burst's
#: garbage collections went through.)
_OWNER_TEXTS: dict[str, str] = {}
_OWNER_TEXTS_MAX = 1024  # bounded: threads and tasks come and go

_SINCE = ',"since":'
#: "since"'s three decimals, for each millisecond, formatted once (not ``{ms:03}`` per value):
#: saves 4.3k instructions a cycle, 1.0%; kept for issue 37's budget.
_MILLIS = tuple(f"{ms:03}" for ms in range(1000))
_STAMP = struct.Struct("<16sq")  # the token's 16 bytes, then "since" in unix milliseconds


def make_value(label: str | None, ttl: float, task: str | None) -> str:
    """A fresh value for one acquisition by the current thread and ``task`` (its name, if the
    owner is an asyncio task): ``new_value``'s value."""
    return new_value(label, ttl, task, threading.current_thread().name)[0]


def new_value(
    label: str | None, ttl: float, task: str | None, thread: str
) -> tuple[str, tuple[bytes, str]]:
    """``make_value``'s value (``thread``: the current thread's name, which the caller has at
    hand), and its parts (``compact_value``'s) as they were made: what an acquisition keeps for
    its lease, made long after its value in a burst (a thousand values later), without reading
    them back from its text."""
    # Everything but the closing brace ("since" changes with every acquisition): the JSON
    # around the task's name is encoded once per thread (a burst of tasks makes one per task).
    head, tail = _owner_parts(process.pid, thread, label, ttl)
    text = f'{head},"task":{_json_text(task)}{tail}' if task is not None else head + tail
    owner_json = _OWNER_TEXTS.get(text)
    if owner_json is None:
        if len(_OWNER_TEXTS) >= _OWNER_TEXTS_MAX:
            _OWNER_TEXTS.clear()
        owner_json = _OWNER_TEXTS[text] = text
    token = os.urandom(16)  # (what secrets.token_bytes(16) returns, without its two calls)
    # Wall clock, for display only, to the millisecond (formatted as integers: a float's
    # formatting goes through the C library's printf, a few percent of a cycle's own work).
    since = time.time_ns() // 1_000_000  # (an int already: int() is a class call)
    value = f"{token.hex()}:{owner_json}{_SINCE}{since // 1000}.{_MILLIS[since % 1000]}}}"
    return value, (_STAMP.pack(token, since), owner_json)


@functools.lru_cache(maxsize=256)  # (saves ~50k instructions a value: json.dumps twice)
def _owner_parts(pid: int, thread: str, label: str | None, ttl: float) -> tuple[str, str]:
    """The owner JSON's fields before ``task`` (its opening brace, ``host``, ``pid``, ``thread``)
    and after it (``label``, ``ttl``: no closing brace), each as ``json.dumps`` writes them."""
    head = json.dumps({"host": _HOST, "pid": pid, "thread": thread}, separators=(",", ":"))
    after: dict[str, object] = {} if label is None else {"label": label}
    after["ttl"] = ttl
    return head[:-1], "," + json.dumps(after, separators=(",", ":"))[1:-1]


#: A string as ``json.dumps`` writes it, by its C encoder without making an encoder per call
#: (saves 3.1k instructions an async cycle, whose values carry the task's name; callgrind).
_json_text = json.encoder.encode_basestring_ascii


def compact_value(value: str) -> tuple[bytes, str]:
    """``value`` (as ``make_value`` made it) in the two parts a held lock keeps: its token and
    "since" packed in 24 bytes (not 32 hex characters and 14 digits), and the owner JSON before
    "since", the one string every lock of that owner shares. ``expand_value`` gives ``value``
    back exactly ("since" has 3 decimals: whole milliseconds). 99 bytes less per held lock."""
    cut = value.rindex(_SINCE)
    seconds, dot, millis = value[cut + len(_SINCE) : -1].partition(".")
    if value[32] != ":" or value[-1] != "}" or not dot or len(millis) != 3:
        raise ValueError("not a value make_value made")  # (a bug of ours: nothing else is kept)
    stamp = _STAMP.pack(bytes.fromhex(value[:32]), int(seconds) * 1000 + int(millis))
    owner = value[33:cut]
    return stamp, _OWNER_TEXTS.get(owner, owner)


def expand_value(stamp: bytes, owner: str) -> str:
    """The value ``compact_value`` took apart, exactly as stored on the masters."""
    token, since = _STAMP.unpack(stamp)
    return f"{token.hex()}:{owner}{_SINCE}{since // 1000}.{_MILLIS[since % 1000]}}}"


def transaction_value(value: str) -> tuple[str, tuple[bytes, str]]:
    """``value`` (as ``new_value`` made it) marked as taken inside a database transaction, for
    display (held until that transaction ends), and its parts (``compact_value``'s)."""
    cut = value.rindex(_SINCE)
    marked = f'{value[:cut]},"txn":true{value[cut:]}'
    return marked, compact_value(marked)


def finished_value(value: str, until: float) -> str:
    """``value`` (ours, as ``make_value`` wrote it) marked finished: kept, unrenewed, until the
    unix wall-clock time ``until`` (for display: the masters' expiry is what frees it)."""
    return f'{value[:-1]},"until":{until:.3f}}}'


T = TypeVar("T")


class UnreadableValue(ValueError):
    """A value that is not a lock value written by django-redlock; the message says why."""


def fingerprint(token: str | bytes) -> str:
    """A short, safe-to-show name for a token: the first hex digits of its sha256."""
    data = token.encode() if isinstance(token, str) else token
    return hashlib.sha256(data).hexdigest()[:FINGERPRINT_LENGTH]


@dataclass(frozen=True)
class Owner:
    """Who took a lock, as its holder wrote it next to the token (for humans, not for safety)."""

    host: str | None = None
    pid: int | None = None
    thread: str | None = None
    task: str | None = None  # the asyncio task, if the holder was one
    label: str | None = None
    since: float | None = None  # unix wall-clock seconds at acquisition
    ttl: float | None = None  # the lease the holder asked for, seconds
    #: Set when the holder's body ended before its ``at_least``: unix seconds until which the
    #: masters keep the lock, unrenewed (``finished_value``).
    until: float | None = None
    #: Taken inside a database transaction: held until that transaction ends, not only until the
    #: holder's block does (``transaction_value``).
    transaction: bool = False

    def __str__(self) -> str:
        parts = [self.host or "?", f"pid {self.pid if self.pid is not None else '?'}"]
        if self.thread:
            parts.append(f"thread {self.thread}")
        if self.task:
            parts.append(f"task {self.task}")
        if self.label:
            parts.append(f"label {self.label!r}")
        if self.until is not None:
            parts.append(f"(finished, held until {_utc(self.until)})")
        if self.transaction:
            parts.append("(held until its transaction ends)")
        return " ".join(parts)


def parse_value(value: bytes, *, size: int | None = None) -> tuple[str, Owner]:
    """``<token>:<owner JSON>`` -> (fingerprint of the token, owner), or ``UnreadableValue``.

    ``size``: the stored length, when ``value`` is only the head of it."""
    size = len(value) if size is None else size
    if size > MAX_VALUE_BYTES:
        raise UnreadableValue(f"{size} bytes, longer than a lock value can be ({MAX_VALUE_BYTES})")
    token, sep, rest = value.partition(b":")
    if not sep or not _TOKEN.fullmatch(token):
        raise UnreadableValue("not <32 hex token>:<owner>, so not a django-redlock lock value")
    try:
        text = rest.decode("utf-8")
    except UnicodeDecodeError:
        raise UnreadableValue("owner is not UTF-8 text") from None
    if not text.startswith("{") or _nested(text):
        raise UnreadableValue("owner is not a flat JSON object")
    try:
        data = json.loads(text)
    except ValueError:
        raise UnreadableValue("owner is not valid JSON") from None
    if not isinstance(data, dict):
        raise UnreadableValue("owner is not a JSON object")
    owner = Owner(
        host=_typed(data.get("host"), str),
        pid=_typed(data.get("pid"), int),
        thread=_typed(data.get("thread"), str),
        task=_typed(data.get("task"), str),
        label=_typed(data.get("label"), str),
        since=_number(data.get("since")),
        ttl=_number(data.get("ttl")),
        until=_number(data.get("until")),
        transaction=data.get("txn") is True,
    )
    return fingerprint(token), owner


def _utc(unix_seconds: float) -> str:
    try:
        moment = datetime.fromtimestamp(unix_seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):  # not a time we can show
        return "?"
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def _nested(text: str) -> bool:
    """Whether a JSON text opens an object or array inside its outer one (outside strings).

    Checked before ``json.loads``, whose recursion a value nested thousands deep would exhaust."""
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "{[":
            depth += 1
            if depth > 1:
                return True
        elif char in "}]":
            depth -= 1
    return False


def _typed(value: object, kind: type[T]) -> T | None:
    return value if isinstance(value, kind) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)
