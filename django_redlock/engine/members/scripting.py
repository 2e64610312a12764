"""Whether a master can run our Lua scripts, as each new connection to it finds out. A server may
run without them (Valkey 9 with its ``lua`` module unloaded; a server with ``EVAL`` renamed away):
it still grants a lock (``SET NX`` is no script) but can neither release nor extend one, nor
take part in a semaphore or a reader's lock, so a grant there would stay until its TTL and its
vote is worth nothing. Such a member abstains: it is told nothing, and its vote in every round
is one failure that names it and what it lacks (logged once, when that is found, and once when
it can run them again).

How it is found, at no cost to a round on a connection already made: on each new connection,
before any round's request, ``SCRIPT LOAD "return 1"`` is written (``PROBE``), its reply read in
its turn and waited for by no one. Until it came, a plain grant sent on that connection is noted,
and undone once the probe says the master lacks scripting (``DELIFEQ``, Valkey's compare-and-
delete that needs no script: a server without it keeps the key until its TTL); no vote read on
that connection counts before the probe's (a master answers in order, so it is read first). A
member that lost scripting while connected is found by its scripts' error replies (a release,
an extension): the grants it gave until then stay until their TTL, and from then on it is told
nothing. Every ``RECHECK`` seconds one round asks it again with the probe alone, on a new
connection (``EVAL`` itself, then): a master restarted with its scripting engine votes again
from the next round on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import hiredis
import redis

from ..base.errors import NodeFailure, lacks_scripting
from ..base.events import logger
from .pipes import Pipe
from .slots import Slot, stamped

#: The probe written on each new connection: it fails exactly where our scripts would, and is no
#: ``EVAL`` (which counts as one in a master's ``INFO commandstats``).
PROBE = hiredis.pack_command(("SCRIPT", "LOAD", "return 1"))  # type: ignore[arg-type]

#: The probe of a member found without scripting, asked again: ``EVAL`` itself, which a server
#: with ``EVAL`` renamed away (found by a script's reply: ``SCRIPT LOAD`` works there) refuses.
RECHECK_PROBE = hiredis.pack_command(("EVAL", "return 1", 0))  # type: ignore[arg-type]

#: How long a member found without scripting abstains before a round asks it again.
RECHECK = 5.0

#: What such a member lacks, in every error that names it.
WHAT = "cannot run Lua scripts (scripting disabled or the lua module unloaded)"


class Flagged(Protocol):
    """What this needs of a master (a ``connections.Node``): its label, and whether a round
    looks into it before writing (``Node.unusual``), which it sets while it is not sure."""

    label: str
    unusual: bool


class Scripting:
    """One master's scripting, as its connections found it."""

    def __init__(self, node: Flagged) -> None:
        self._node = node
        self._usual = node.unusual  # (what the node is without this)
        #: The server's words when it could not run our scripts ("": it can, or not found yet).
        self.missing = ""
        #: Monotonic time from which one round asks it again (while ``missing``).
        self.recheck_at = 0.0
        #: ``missing``, or a probe not answered yet: a round looks closer (``out``, ``abstain``).
        self.unsure = False
        self._failure: NodeFailure | None = None
        self.forget()

    def forget(self) -> None:
        """No connections of ours yet (a new node, or a forked child); a guard no thread holds."""
        self._guard = threading.RLock()  # (a write under it may close the pipe)
        #: Per connection whose probe is not answered yet: the plain grants sent on it since.
        self._grants: dict[Pipe, list[tuple[Any, Any]]] = {}
        self._refresh()

    def _refresh(self) -> None:
        self.unsure = bool(self.missing or self._grants)
        self._node.unusual = self._usual or self.unsure

    # --- a new connection --------------------------------------------------------------------

    def probe(self, pipe: Pipe) -> Pipe:
        """Write the probe on ``pipe`` (new, not shared yet, nothing written through it), before
        any round's request: on its socket, as ``incarnations`` writes ``INFO``, so that the
        round's request is still the first of its loop tick (written at once)."""
        slot = stamped(time.monotonic())
        slot.abandoned = True  # (no round waits for it: its reply goes to ``on_late``)
        slot.on_late = lambda reply: self._answered(pipe, reply)
        sock = pipe._sock  # noqa: SLF001 (as ``incarnations``: no public handle on it)
        probe = RECHECK_PROBE if self.missing else PROBE
        try:
            if sock.send(probe) != len(probe):  # (an empty send buffer takes it whole)
                raise redis.ConnectionError("the new connection would not take the probe at once")
        except (redis.RedisError, OSError) as exc:
            pipe.close(exc)
            raise
        with self._guard:
            for closed in [p for p in self._grants if p.closed]:  # (broke before answering)
                del self._grants[closed]
            self._grants[pipe] = []
            self._refresh()
        pipe.pending.append(slot)  # (after the INFO of ``incarnations``, if any: in order)
        return pipe

    def _answered(self, pipe: Pipe, reply: object) -> None:
        words = lacks_scripting(reply)
        with self._guard:
            grants = self._grants.pop(pipe, None) or []
            if words is None:
                recovered = bool(self.missing)
                self.missing, self._failure = "", None
                self._refresh()
            else:
                self._mark(words)
        if words is None:
            if recovered:
                logger.warning("django_redlock: %s can run Lua scripts again: it votes", self.label)
            return
        now = time.monotonic()
        for key, value in grants:  # sent before we knew: undone (see the module's docstring)
            undo = pipe.send(_delifeq(key, value), now)
            if undo is not None:
                pipe.abandon(undo)

    # --- a connection already made -------------------------------------------------------------

    def refused(self, error: BaseException) -> None:
        """A script's error reply (a round's): if it says scripting is missing, the member lost
        it while connected; it abstains from now on."""
        words = lacks_scripting(error)
        if words is not None:
            with self._guard:
                self._mark(words)

    def _mark(self, words: str) -> None:
        """(Under the guard.) The member lacks scripting: abstain until ``RECHECK`` from now;
        logged once, when it is found."""
        found = not self.missing
        self.missing, self.recheck_at = words, time.monotonic() + RECHECK
        self._failure = NodeFailure(
            self.label,
            "error",
            f"{WHAT}: {words}; it abstains, asked again every {RECHECK:.0f} s: it would grant "
            "locks it can neither release nor extend; load its scripting engine (Valkey: the "
            "lua module) or list another master",
        )
        self._refresh()
        if found:
            logger.warning("django_redlock: %s", self._failure)

    @property
    def label(self) -> str:
        return self._node.label

    # --- a round ---------------------------------------------------------------------------------

    def out(self, now: float) -> NodeFailure | None:
        """The failed vote that stands for this member's in a round at ``now``, unasked; None:
        ask it (it can run scripts, or may: a probe is under way; or this round asks it again,
        on a new connection, the others waiting ``RECHECK`` more)."""
        if not self.missing:
            return None
        with self._guard:
            if not self.missing:
                return None
            if now < self.recheck_at:
                return self._failure
            self.recheck_at = now + RECHECK
            return None

    def send(
        self, pipe: Pipe, command: tuple[Any, ...], write: Callable[[], Slot | None]
    ) -> Slot | None:
        """``write()`` (a round's request on ``pipe``) unless the member is known to lack
        scripting (then None: not sent, even on the new connection that asks it again); a plain
        grant sent before ``pipe``'s probe answered is noted, to be undone if it says the server
        lacks scripting."""
        with self._guard:  # (the probe's answer cannot come between the write and the note)
            if self.missing:  # (asked again: the probe alone, on a new connection)
                return None
            grants = self._grants.get(pipe)
            slot = write()
            if grants is not None and slot is not None and command[0] == "SET":
                grants.append((command[1], command[2]))
            return slot

    def abstaining(self) -> bool:
        return bool(self.missing)

    def failure(self) -> NodeFailure | None:
        return self._failure


def _delifeq(key: Any, value: Any) -> bytes:
    return hiredis.pack_command(("DELIFEQ", key, value))  # type: ignore[arg-type,no-any-return]


class Member(Protocol):
    """What a round knows of a member here (a ``connections.Node``)."""

    label: str
    scripting: Scripting


def look(node: Member, pipe: Pipe | None, now: float) -> tuple[NodeFailure | None, Pipe | None]:
    """What a round at ``now`` does with a member unsure of its scripting, whose pipe is
    ``pipe``: the failed vote that stands for its own (it is told nothing), or None and the pipe
    to ask it on (None: a new connection, when this round asks it again)."""
    if pipe is not None and pipe.pending:
        pipe.try_pump()  # (a probe's answer, which no round may be waiting for)
    lacking = node.scripting.out(now)
    if lacking is None and node.scripting.missing and pipe is not None:
        pipe.close()  # (asked again: the probe goes on a new connection)
        pipe = None
    return lacking, pipe


def abstain(nodes: Sequence[Member], replies: list[Any]) -> None:
    """At the end of a round that looked closer: a member lacking scripting has failed, whatever
    it said (a grant read before we knew, on a connection whose probe had not answered when its
    request left, is undone by the probe's answer)."""
    for i, node in enumerate(nodes):
        failure = node.scripting.failure()
        if failure is not None:
            replies[i] = failure
