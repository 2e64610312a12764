"""The errors of an acquisition that gave up, worded for the caller: ``not_acquired`` (held by
another owner, or too few masters, or no validity left) and ``overloaded`` (no turn among this
process's own rounds). Out of ``procedures`` (which raises them), so that it stays readable."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from ..base.errors import LockContended, Overloaded, QuorumUnavailable
from ..waiting import admission
from ..waiting.admission import Full
from .steps import Masters, failures

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..base.protocol import Tally
    from ..members.interface import Reply


class Request(Protocol):
    """What the errors say of an acquisition's request (a ``procedures.Want``)."""

    @property
    def resource(self) -> str: ...
    @property
    def ttl(self) -> float: ...
    @property
    def wait(self) -> float: ...


class LostRound(Protocol):
    """What the errors say of the last round an acquisition lost (a ``procedures.Lost``)."""

    @property
    def result(self) -> Tally: ...
    @property
    def replies(self) -> Sequence[Reply]: ...


def overloaded(want: Request, full: Full) -> Overloaded:
    """This process's own queue of rounds had no turn for the attempt within its patience."""
    if full.waited:
        when = f"waited {full.waited:.3f}s for its turn"
    elif full.ran_out:
        when = "its wait was over before it came to the queue, refused at once"
    else:
        when = f"its turn was expected in {full.expected:.3f}s, refused at once"
    patience = f"wait={want.wait}s" if want.wait > 0 else f"{admission.PATIENCE}s for wait=0"
    return Overloaded(
        want.resource,
        f"lock {want.resource!r} not attempted: this process is overloaded: "
        f"{full.queued} rounds were queued ahead of it locally ({when}; patience {patience}); "
        f"the masters were not asked",
        queued=full.queued,
        waited=full.waited,
    )


def not_acquired(
    masters: Masters,
    want: Request,
    lost: LostRound | None,
    attempts: int,
    *,
    contended: str = "",
) -> LockContended | QuorumUnavailable:
    """The error of an acquisition that gave up. ``contended``: what holds the resource, in the
    words of its mode (a semaphore's permits, a writer), when holders are why."""
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    if lost is None:  # it never got its turn among this process's waiters
        return LockContended(
            want.resource,
            f"lock {want.resource!r} is held by another owner; earlier waiters of this process "
            f"were still ahead after wait={want.wait}s",
            [],
            attempts=attempts,
        )
    result, detail = lost.result, failures(masters, lost.replies)
    if result.granted >= result.quorum:
        return QuorumUnavailable(
            want.resource,
            f"lock {want.resource!r}: masters answered too late, no validity left of "
            f"ttl={want.ttl}s ({tries})",
            detail,
            attempts=attempts,
        )
    if result.contended:
        return LockContended(
            want.resource,
            f"{contended or f'lock {want.resource!r} is held by another owner'} ({tries}, "
            f"wait={want.wait}s)",
            detail,
            attempts=attempts,
        )
    return QuorumUnavailable(
        want.resource,
        f"lock {want.resource!r}: only {result.granted + result.denied} of "
        f"{result.total} masters answered, {result.quorum} needed ({tries})",
        detail,
        attempts=attempts,
    )
