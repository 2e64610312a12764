"""One round: one request to every master, and their replies within one budget. No blocking here:
``exchange`` is a generator that yields what it must wait for (a connection, replies), and the
drivers (``drivers.fan_out`` with threads, ``drivers.afan_out`` with asyncio) do the waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import AskError, MovedError, NoScriptError, ReadOnlyError, TryAgainError

from ..base.errors import NodeFailure, error_detail
from ..base.protocol import quorum
from ..scripts.plain import Script
from . import detours, scripting
from .connections import Node
from .packing import Command, Requests, pack
from .pipes import Pipe
from .quarantine import abstain, abstains
from .slots import ANSWERS, PENDING, Broken, Slot
from .unawaited import abandon_waiting, unawaited

#: A master that let a request go unanswered for its whole budget (paused, overloaded, cut off)
#: is left out of the rounds for this long: it would most likely cost every round its budget
#: again, where a dead one refuses at once. At most ``N - quorum`` masters are left out at a
#: time, so leaving out never by itself makes a quorum impossible.
SKIP_SILENT_FOR = 1.0

Reply = object  # a master's raw answer, or a NodeFailure when it gave none within its budget


class RoundReplies(list[Reply]):
    """One round's replies, one per master in order, and which of them answered a request *asked
    again* (``asked_again``, by index): the first one went out and its connection broke before
    the reply came, so the master may have applied the request already. A compare-and-delete
    asked again that finds nothing then says nothing about whom the key belonged to.

    And ``began``: the monotonic time read just before the first of its requests was written
    (the earliest ``Slot.sent_at``: an async pipe stamps it when it writes, at the end of the
    loop tick). Every master received its request later still, and started any TTL it set
    later again: so a validity counted from ``began`` ends before the key does on every master
    that granted it (less drift), however long the round waited in this process before its
    requests left (its turn among our rounds, a loop tick busy with thousands of tasks) and
    however late it read its replies."""

    asked_again: frozenset[int] = frozenset()
    began: float = 0.0


def failure(node: Node, exc: BaseException) -> NodeFailure:
    kind = "timeout" if isinstance(exc, redis.TimeoutError | TimeoutError) else "error"
    return NodeFailure(node.label, kind, error_detail(exc))


# (Not frozen, as ``protocol.Tally``: made every round.)
@dataclass(slots=True)
class Connect:
    """A round waits for: ``node``'s pipe, made now within ``budget``, or being made by another
    round (then awaited: that attempt has its own budget). Answered with the ``Pipe`` or the
    exception that prevented it."""

    node: Node
    budget: float


@dataclass(slots=True)  # (not frozen, as ``Connect``)
class Replies:
    """A round waits for: the replies of ``sent`` (pipe, slot) pairs, until ``deadline``; or,
    with ``enough``, only until ``needed`` more of them are answers that ``enough`` accepts (the
    round is decided: it returns at quorum)."""

    sent: list[tuple[Pipe, Slot]]
    deadline: float
    enough: Decides | None = None
    needed: int = 0


#: Whether a master's answer counts towards deciding the round (a grant, a confirmation).
Decides = Callable[[object], bool]


Exchange = Generator[Connect | Replies | detours.Delay, Any, RoundReplies]

#: How a thread waits for a round's replies in place (``drivers._wait_replies``): as ``Replies``,
#: or, with a decider, until one reply came (the round tallies it, and waits again if undecided).
WaitHere = Callable[[list[tuple[Pipe, Slot]], float, "Decides | None"], None]

#: How a driver finds a master's open pipe for this round (the running loop's); None: the
#: threads' pipe (``Node.pipe``, if open: read in the loop, without a call per master).
PipeOf = Callable[[Node], Pipe | None]


def exchange(
    nodes: Sequence[Node],
    command: Command,
    budget: float,
    pipe_of: PipeOf | None,
    script: Script | None = None,
    enough: Decides | None = None,
    wait_here: WaitHere | None = None,
) -> Exchange:
    """Send ``command`` to every master, all before waiting for any reply; then take every reply
    within ``budget`` seconds of its request leaving (or, with ``enough``, only until a quorum
    of replies are answers it accepts: see ``unawaited``). A master that has not answered by then
    counts as failed; its slot is abandoned (the reply is dropped when it comes, never mistaken
    for another request's answer) and the master is *silent* for SKIP_SILENT_FOR seconds: the
    next rounds tell it their request without waiting (so that a release still follows its SET
    there, in order) and count it as failed, until it has caught up. ``script``: the script
    ``command`` runs (EVALSHA), sent with its source to masters not known to have it, and resent
    so to one that answers NOSCRIPT. A Redis Cluster member is asked on the shard that owns the
    request's slot (``Node.route``), its ``MOVED``/``ASK``/``TRYAGAIN`` followed (``detours``).

    ``wait_here``: a thread's round waits for its replies by calling it rather than by yielding
    ``Replies`` (a resumption, an object and a pass of its driver fewer); interrupted there
    (Ctrl-C), it gives up the slots still waiting, as the driver would. Second tries yield."""
    began = time.monotonic()
    nodes = list(nodes)  # (a Cluster member's entry becomes the shard it routes to)
    # The usual request written directly, its other forms (``Requests``) made only if needed:
    # with ``Pipe.write``, saves 56k instructions a cycle, 14% (callgrind, two rounds of five).
    packed, sha = pack(command), None if script is None else script.sha
    requests: Requests | None = None
    # A thread stamps its slots as it writes them, in this loop's order: the first written is the
    # earliest, the last the latest (no pass over them). A loop's pipe stamps them at its flush.
    threads = pipe_of is None
    replies = RoundReplies([None] * len(nodes))
    asked_again: set[int] | None = None  # (made by the first: a second try's, seldom)
    # What was sent and is waited for: masters' indexes, and (pipe, slot) pairs for the drivers.
    where: list[int] = []
    sent: list[tuple[Pipe, Slot]] = []
    needed = quorum(len(nodes))
    may_leave_out = len(nodes) - needed
    unconnected: list[int] | None = None  # (made by the first: a connect's, seldom)
    watched = False  # a member under quarantine's watch (MAX_TTL), or unsure of its scripting
    for i, node in enumerate(nodes):
        if node.unusual:  # (routed, watched, acknowledged, or unsure of its scripting: seldom)
            if node.routed:
                node = nodes[i] = node.route(command)
            watched = watched or node.watch is not None
            pipe = node.pipe if pipe_of is None else pipe_of(node)
            if node.scripting.unsure:  # (see ``scripting``)
                lacking, pipe = scripting.look(node, pipe, began)
                if lacking is not None:
                    replies[i] = lacking  # (told nothing: it would grant what it cannot undo)
                    continue
                watched = True
        else:
            pipe = node.pipe if pipe_of is None else pipe_of(node)
            if (
                pipe is not None
                and not pipe.pending
                and node.silent_until <= began
                and (sha is None or sha in node.warm)
            ):
                # The usual (idle, not silent, knows the script): what the checks below come to.
                slot = pipe.write(packed) if threads else pipe.send(packed, began)
                if slot is not None:
                    where.append(i)
                    sent.append((pipe, slot))
                    continue
        requests = requests or Requests(command, script, packed)
        if threads and pipe is not None and pipe.closed:  # (a loop's pipe_of: open ones only)
            pipe = None
        owes = False
        # (``pending`` first: an idle pipe owes nothing; ``owes`` is a property call per master.)
        if pipe is not None and pipe.pending and pipe.owes:
            pipe.try_pump()  # its late replies may have come meanwhile
            owes = pipe.owes
        if node.acks is not None and (out := node.acks.sitting_out(command, script, began)):
            replies[i] = out  # (see acks.SIT_OUT)
            continue
        if node.silent_until and node.silent_until > began and may_leave_out > 0:
            if pipe is None or owes:
                may_leave_out -= 1
                replies[i] = _tell(node, pipe, requests.for_node(node))
                continue
            node.silent_until = 0.0  # its late replies came: it answers again
        elif pipe is not None and owes and pipe.stalled(began, SKIP_SILENT_FOR):
            # Silent for a while and still owing: its replies may never come (a broken path,
            # not a paused master). Ask it afresh rather than behind them.
            pipe.close()
            pipe = None
        if pipe is not None:
            slot = requests.send(node, pipe, began)
            if slot is not None:
                where.append(i)
                sent.append((pipe, slot))
                continue
        if unconnected is None:
            unconnected = []
        unconnected.append(i)
    for i in unconnected or ():
        assert requests is not None  # noqa: S101 (made by the loop above, for an unconnected)
        node = nodes[i]
        made = yield from _connect(node, budget)
        watched = watched or node.scripting.unsure  # (a new connection's probe: see ``abstain``)
        if not isinstance(made, Pipe):
            replies[i] = made
        elif (slot := requests.send(node, made, time.monotonic())) is not None:
            where.append(i)
            sent.append((made, slot))
        else:
            replies[i] = NodeFailure(node.label, "error", "connection lost while sending")
    written = sent  # (``sent`` is rebound below, never changed in place)
    # A master that answers the script is known to have it (``Requests.answered``): news only
    # if some master was sent its source (the others were sent its SHA: known to have it).
    warm = None if requests is None or requests.sourced is None else sha
    while sent:
        # Back when the round is decided, or all came (a thread's: one came, see ``WaitHere``), or
        # the last is due (each master's budget runs from when its request left); early when a
        # reply needs a second try (a broken pipe, a forgotten script): it keeps most of the budget.
        if wait_here is None:
            yield Replies(sent, _due(sent, budget), enough, needed)
        else:
            try:
                due = sent[-1][1].sent_at + budget if threads else _due(sent, budget)
                wait_here(sent, due, enough)
            except BaseException:
                abandon_waiting(sent)
                raise
        later_where: list[int] = []
        later: list[tuple[Pipe, Slot]] = []
        # (No strict=True: saves 3.1k instructions a cycle, 0.8%; kept for issue 37's budget.)
        for i, each in zip(where, sent):  # noqa: B905
            reply = each[1].reply
            if type(reply) in ANSWERS:  # the usual case: an answer, nothing to look into
                if warm is not None:
                    nodes[i].warm.add(warm)
            elif reply is PENDING and time.monotonic() < each[1].sent_at + budget:
                later_where.append(i)
                later.append(each)
                continue
            else:
                pipe, slot = each
                requests = requests or Requests(command, script, packed)
                reply = yield from _vote(nodes, i, pipe, slot, requests, began, budget)
                watched = watched or nodes[i].scripting.unsure  # (asked again: a new connection)
                if _ask_again(pipe, slot, began):
                    if asked_again is None:
                        asked_again = set()
                    asked_again.add(i)  # _vote asked it once more, on a new connection
                if type(reply) not in ANSWERS:
                    replies[i] = reply
                    continue
            replies[i] = reply
            # (Grants counted until decided, an abstaining member's never: see ``abstain``.)
            if enough is not None and needed > 0 and enough(reply):
                if not (watched and (abstains(nodes[i]) or nodes[i].scripting.missing)):
                    needed -= 1
        where, sent = later_where, later
        if enough is not None and needed <= 0 and sent:
            awaited_where: list[int] = []
            awaited: list[tuple[Pipe, Slot]] = []  # (see ``detours``)
            requests = requests or Requests(command, script, packed)
            for i, each in zip(where, sent, strict=True):
                if nodes[i].redirects:
                    awaited_where.append(i)
                    awaited.append(each)
                else:
                    replies[i] = unawaited(nodes[i], *each, requests)
            where, sent, enough = awaited_where, awaited, None
        elif enough is not None and needed <= 0:
            break
    if asked_again:
        replies.asked_again = frozenset(asked_again)
    if watched:
        abstain(nodes, replies)
        scripting.abstain(nodes, replies)
    ordered = threads and written
    replies.began = written[0][1].sent_at if ordered else _first_sent(written, began)
    return replies


# (Loops in Python: ``max``/``min`` over ``map``s cost more than they do, in parsing and calls.)
def _due(sent: list[tuple[Pipe, Slot]], budget: float) -> float:
    """When the last of ``sent`` is due: its request's stamp plus the node budget."""
    latest = sent[0][1].sent_at
    for _, slot in sent:
        if slot.sent_at > latest:
            latest = slot.sent_at
    return latest + budget


def _first_sent(written: list[tuple[Pipe, Slot]], began: float) -> float:
    """The earliest stamp of ``written`` (``RoundReplies.began``); ``began`` if none was."""
    if not written:
        return began
    first = written[0][1].sent_at
    for _, slot in written:
        if slot.sent_at < first:
            first = slot.sent_at
    return first


_SECOND_TRY = (Broken, NoScriptError, MovedError, AskError, TryAgainError)


def second_try(slot: Slot) -> bool:
    """Whether ``slot``'s answer asks for a second try rather than a vote."""
    reply = slot.reply
    return type(reply) not in ANSWERS and isinstance(reply, _SECOND_TRY)


def _vote(
    nodes: list[Node],
    i: int,
    pipe: Pipe,
    slot: Slot,
    requests: Requests,
    began: float,
    budget: float,
) -> Generator[Connect | Replies | detours.Delay, Any, Reply]:
    """What ``nodes[i]`` answered, after the second try it may need: a pipe that was open before
    this round and broke (the master restarted, or closed an idle connection: the request went
    into the void) is reconnected and asked once more; a master that forgot our
    script is asked again with its source; a Cluster shard's ``MOVED``, ``ASK``, ``TRYAGAIN``
    is followed (``detours``), within a node budget of its own as any second try (the
    redirection came in time: a round that read it late, busy connecting to other masters,
    must not blame the shard for that). Safe to repeat: our scripts are idempotent, and a
    repeated SET NX can only under-count our votes."""
    node = nodes[i]
    reply = _late(node, pipe, slot)
    if _ask_again(pipe, slot, began):
        made = yield from _connect(node, budget)
        if not isinstance(made, Pipe):
            return made
        pipe = made
        reply = yield from _ask(node, pipe, requests, budget)
    asking = False  # an ASK detour: ASKING goes before each request to its target
    if node.redirects:
        pipe, reply, asking = yield from detours.follow(
            nodes, i, pipe, reply, requests, budget, _ask, _connect
        )
        node = nodes[i]
    if requests.forgot_script(node, pipe, reply):  # (asked again with the source: it is not warm)
        reply = yield from _ask(node, pipe, requests, budget, asking=asking)
    if isinstance(reply, Broken):
        return failure(node, reply.error)
    if isinstance(reply, Exception) and not isinstance(reply, NodeFailure):
        # An error reply. Every one counts as a failed vote, whatever its class: redis-py maps
        # LOADING, NOAUTH, "max number of clients" to classes that are not ResponseErrors, and
        # none of them is a grant. After a ConnectionError one (closing on us) the pipe goes.
        node.scripting.refused(reply)  # (one that says it lacks scripting: it abstains now)
        if isinstance(reply, redis.ConnectionError | ReadOnlyError):
            # (READONLY: the member was demoted to a replica. A new connection is where its
            # new identity is read, and a Sentinel member finds its new primary.)
            pipe.close(reply)
        return failure(node, reply)
    if not isinstance(reply, NodeFailure):
        requests.answered(node)
    return reply


def _ask_again(pipe: Pipe, slot: Slot, began: float) -> bool:
    """Whether ``slot``'s pipe, opened before this round, broke before its reply: the request may
    have gone into the void, or may have been applied with only the reply lost."""
    return isinstance(slot.reply, Broken) and pipe.opened_at < began


def _late(node: Node, pipe: Pipe, slot: Slot) -> Reply:
    """``slot``'s reply, or (none within the budget) a timeout failure: the slot is abandoned
    and the master is silent for a while. A reply already received counts even past the budget:
    only a master that truly did not answer is blamed, not a busy client."""
    if slot.reply is PENDING:
        pipe.try_pump()
    if slot.reply is PENDING:
        pipe.abandon(slot)
        node.silent_until = time.monotonic() + SKIP_SILENT_FOR
        return failure(node, TimeoutError("no reply within the node budget"))
    return slot.reply


_ASKING = pack(("ASKING",))


def _ask(
    node: Node, pipe: Pipe, requests: Requests, budget: float, *, asking: bool = False
) -> Generator[Replies, Any, Reply]:
    slot = requests.send(node, pipe, time.monotonic(), _ASKING if asking else b"")
    if slot is None:
        return NodeFailure(node.label, "error", "connection lost while resending")
    while slot.reply is PENDING and time.monotonic() < slot.sent_at + budget:
        yield Replies([(pipe, slot)], slot.sent_at + budget)
    return _late(node, pipe, slot)


def _connect(node: Node, budget: float) -> Generator[Connect, Any, Pipe | Reply]:
    """The node's pipe, or the NodeFailure that stands for its vote. A master that could not be
    reached within the budget is silent (see SKIP_SILENT_FOR)."""
    made = yield Connect(node, budget)
    if isinstance(made, Pipe):
        return made
    lost = failure(node, made)
    if lost.reason == "timeout":
        node.silent_until = time.monotonic() + SKIP_SILENT_FOR
    return lost


def _tell(node: Node, pipe: Pipe | None, request: bytes) -> NodeFailure:
    """Send to a silent master without waiting for its answer (on its pipe, after the requests
    it has not answered yet), or not at all if it has no pipe."""
    silent = "silent: it let a request go unanswered for its whole budget"
    slot = None if pipe is None else pipe.send(request, time.monotonic())
    if pipe is None or slot is None:
        return NodeFailure(node.label, "timeout", f"{silent}; not asked")
    pipe.abandon(slot)
    return NodeFailure(node.label, "timeout", f"{silent}; told, not waited for")
