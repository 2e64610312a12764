"""The lock the Django layer hands out (``redlock()``, ``@locked``, ``lock_view``, guarded
commands, ``RedlockTask``'s run lock): the engine's ``Lock``, plus the DB guard while it is held
(``dbguard.py``), the wait for the transaction it was taken in (``transactions.py``: released
when that transaction ends, not before its ``COMMIT``) and OpenTelemetry spans around its
operations (``otel.py``, when installed). The engine's own
``Lock`` (``Redlock(...).lock()``) has neither: the engine stays Django-free."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from . import dbguard, transactions
from .conf import get_redlock
from .contrib import otel
from .contrib.prometheus import UNTEMPLATED
from .engine import Lock, LockLost
from .engine.algorithm import holding
from .engine.algorithm.procedures import Want, Won
from .engine.base.values import transaction_value
from .engine.handles.options import WRITING, Options
from .engine.kinds.modes import check_mode
from .engine.kinds.permit import PermitLock
from .engine.kinds.readers import ReaderLock
from .engine.leases.leases import Lease, Owner, current_owner
from .engine.redlock import check_bounds_for
from .engine.running.drivers import run

if TYPE_CHECKING:
    from .engine.redlock import Redlock


class _Layer:
    """A ``DjangoLock``'s own options."""

    __slots__ = ("db_guard", "release_before_commit", "template")

    def __init__(
        self, db_guard: bool, template: str | None, release_before_commit: bool = False
    ) -> None:
        self.db_guard = db_guard
        self.template = template or UNTEMPLATED
        self.release_before_commit = release_before_commit


_DEFAULTS = _Layer(True, None)


def layer(db_guard: object, template: object, release_before_commit: object = False) -> _Layer:
    """The Django layer's options of a lock (``ValueError`` naming a bad one): the record
    shared by every lock that keeps the defaults, or one of its own."""
    if db_guard is True and template is None and release_before_commit is False:
        return _DEFAULTS
    if not isinstance(db_guard, bool):
        raise ValueError(f"db_guard must be True or False, got {db_guard!r}")
    if template is not None and (not isinstance(template, str) or not template):
        raise ValueError(f"template must be a non-empty str or None, got {template!r}")
    check_release_before_commit(release_before_commit)
    return _Layer(db_guard, template, release_before_commit)  # type: ignore[arg-type]


def check_release_before_commit(value: object) -> bool:
    """``release_before_commit`` as given, if it is a bool; else ``ValueError`` naming it."""
    if not isinstance(value, bool):
        raise ValueError(
            f"release_before_commit must be True or False, got {value!r} (True releases the "
            f"lock before the enclosing transaction commits: the next holder may read data "
            f"from before our commit)"
        )
    return value


class DjangoLock(Lock):
    """A ``Lock`` guarded from acquisition to release (unless ``db_guard=False``): once its
    lease is lost or its validity is over, the next query in the acquiring context raises
    ``LockLost``; and whose acquire, extend and release are traced when OpenTelemetry is
    installed.

    The guard hooks where the engine's handle takes a lease (``_hold``, and ``_reenter`` for a
    re-entry) and lets go of it (``_left_inner`` for an inner entry, ``_released`` after the
    release round): every acquisition and release goes through them, sync or async (a ``with``
    block, a locked generator, ``release()``, whichever thread ends it). The spans wrap
    ``acquire`` / ``aacquire``, ``extend`` / ``aextend`` and ``_release`` / ``_arelease``."""

    # As the engine's ``Lock``: slots, and the options as one record shared by every lock that
    # keeps the defaults (``_Layer``), not two fields per held lock. Made by ``redlock()``, which
    # sets ``_layer`` (``layer()``, or ``plain()``'s kept one) after the engine's constructor.
    __slots__ = ("_layer",)
    _layer: _Layer

    db_guard: bool = property(  # type: ignore[assignment]
        attrgetter("_layer.db_guard"), lambda lock, value: lock._own_layer("db_guard", value)
    )
    #: The label of the per-template metrics (never the formatted resource: unbounded).
    template: str = property(  # type: ignore[assignment]
        attrgetter("_layer.template"), lambda lock, value: lock._own_layer("template", value)
    )
    #: True: released when its block ends even inside a transaction, before that commits (the
    #: hazard ``transactions.py`` exists for). False (the default): held until it ends.
    release_before_commit: bool = property(  # type: ignore[assignment]
        attrgetter("_layer.release_before_commit"),
        lambda lock, value: lock._own_layer("release_before_commit", value),
    )

    #: Taken inside a transaction, released when it ends (``transactions.py``): a writer's
    #: update must be committed before the next holder reads. Not a reader's (below).
    waits_for_transaction: ClassVar[bool] = True

    def _own_layer(self, name: str, value: object) -> None:
        """Set one of its options in a record of its own (``_DEFAULTS`` is everyone's, and
        ``plain()`` shares a record between the locks made with the same options), checked as
        ``redlock()`` checks it (``ValueError`` naming a bad one: the observer reads the
        template as a metric label, unchecked)."""
        with WRITING:  # (as the engine's options: two threads at once would lose one)
            current = self._layer
            options = {
                "db_guard": current.db_guard,
                "template": current.template,
                "release_before_commit": current.release_before_commit,
                name: value,
            }
            self._layer = layer(**options)

    # --- the guard: hooked where the engine takes and lets go of a lease, sync and async alike --
    # (Not around ``acquire``/``aacquire`` and the releases: a wrapping coroutine per
    # operation, and two lookups of the caller's lease, cost an async cycle more than the guard.)

    def _want(self, owner: Owner) -> Any:  # (a mode's own Want: PermitWant, ReaderWant)
        want = super()._want(owner)
        if (
            transactions.databases_used is not False
            and self.waits_for_transaction
            and not self._layer.release_before_commit
            and transactions.inside()
        ):
            # Said in its value, for the admin and ``redlock_status`` (no round of its own).
            value, parts = transaction_value(want.value)
            return replace(want, value=value, parts=parts)
        return want

    def _hold(self, owner: Owner, want: Want, won: Won) -> Lease:
        lease = super()._hold(owner, want, won)
        self._guard(lease, owner)
        if (
            transactions.databases_used is not False
            and self.waits_for_transaction
            and not self._layer.release_before_commit
        ):
            transactions.taken(self, owner, lease)
        return lease

    def _reenter(self, owner: Owner) -> bool:
        if transactions.holds and transactions.adopt(self, owner):
            return True
        if not super()._reenter(owner):
            return False
        lease = self._callers.get(owner)
        if lease is not None:
            self._guard(lease, owner)  # (each entry is guarded, and each exit unguards one)
        return True

    def _guard(self, lease: Lease, owner: Owner) -> None:
        if self._layer.db_guard:
            dbguard.install_here()
            dbguard.guard(lease, self, owner)

    def _left_inner(self, lease: Lease) -> None:
        dbguard.unguard(lease)  # an inner entry: no round, unguarded now

    def _released(self, owner: Owner, lease: Lease) -> None:
        # After the release round, whether or not it confirmed (called from its ``finally``).
        try:
            super()._released(owner, lease)
        finally:
            dbguard.unguard(lease)
            if transactions.holds:
                transactions.forget(lease)

    # --- held until the transaction ends (``transactions.py``) --------------------------------

    def _release_waited(self, owner: Owner, lease: Lease) -> None:
        """Release ``lease``, whose block ended before the transaction it waited for, now that
        the transaction ended (``_release`` without the letting go of the block's entry, done
        when the block ended)."""
        lease.released = True
        self._redlock.holders.remove(lease)
        tracer = otel.tracer()
        try:
            if tracer is None:
                run(self._redlock, holding.let_go(self._redlock, lease, self.at_least))
            else:
                with otel.operation(tracer, "redlock.release", self):
                    run(self._redlock, holding.let_go(self._redlock, lease, self.at_least))
        finally:
            self._released(owner, lease)

    # --- traced, when OpenTelemetry records spans ---------------------------------------------

    def acquire(self) -> DjangoLock:
        tracer = otel.tracer()
        if tracer is None:
            super().acquire()
        else:
            with otel.operation(tracer, "redlock.acquire", self):
                super().acquire()
        return self

    def aacquire(self) -> Coroutine[Any, Any, Lock]:
        # super().aacquire() binds the calling task as the owner now, as the engine's does; the
        # guard is bound to it now too (``dbguard.expect``): ``wait_for``, ``gather``,
        # ``create_task`` and ``shield`` run the acquisition in a child task whose context is
        # thrown away, and the caller's queries must be the guarded ones.
        acquiring = super().aacquire()
        if self._layer.db_guard:
            dbguard.expect(self, current_owner(), acquiring)
        tracer = otel.tracer()
        if tracer is None:
            return acquiring
        return self._traced(tracer, "redlock.acquire", acquiring)

    def extend(self, ttl: float | None = None) -> float:
        tracer = otel.tracer()
        if tracer is None:
            return super().extend(ttl)
        with otel.operation(tracer, "redlock.extend", self):
            return super().extend(ttl)

    def aextend(self, ttl: float | None = None) -> Coroutine[Any, Any, float]:
        tracer = otel.tracer()
        if tracer is None:
            return super().aextend(ttl)
        return self._traced(tracer, "redlock.extend", super().aextend(ttl))

    async def _traced(self, tracer: Any, name: str, operation: Coroutine[Any, Any, Any]) -> Any:
        with otel.operation(tracer, name, self):
            return await operation

    def _release(self, owner: Owner) -> None:
        if transactions.holds:  # (empty unless a lock was taken inside a transaction)
            lease = self._callers.get(owner)
            if lease is not None and transactions.block_ended(self, owner, lease):
                return  # released when its transaction ends
        tracer = otel.tracer()
        if tracer is None:
            super()._release(owner)
        else:
            with otel.operation(tracer, "redlock.release", self):
                super()._release(owner)

    def _arelease(self, owner: Owner) -> Coroutine[Any, Any, None]:
        tracer = otel.tracer()
        if tracer is None:
            return super()._arelease(owner)
        return self._traced(tracer, "redlock.release", super()._arelease(owner))


class _Preset(NamedTuple):
    """What every plain lock made by ``plain()`` with the same options on one engine shares:
    its options, checked once."""

    key_prefix: str
    ttl: float
    wait: float
    options: Options
    layer: _Layer


#: The presets of ``plain()`` (by its options) and the engine they were checked for: an engine
#: built from other settings (``override_settings``, ``setting_changed``) has a table of its
#: own, checked anew (its TTL, wait and ``MAX_TTL`` are the settings').
_presets: tuple[Redlock | None, dict[tuple[object, ...], _Preset]] = (None, {})

#: Option sets kept at most (a TTL computed per call would make one each): past it, the table
#: starts again.
PRESETS_KEPT = 256


def plain(
    resources: tuple[str, ...],
    ttl: float | None,
    wait: float | None,
    label: str | None,
    db_guard: bool,
    template: str | None,
    release_before_commit: bool = False,
) -> DjangoLock:
    """``redlock(*resources, ttl=, wait=, label=, db_guard=, template=,
    release_before_commit=)`` with every other option left at its default: the usual lock, made
    on every ``with redlock(r):``.

    Its options are checked once per engine and set of values (a ``ValueError`` names a bad
    one, as ``DjangoLock(...)`` does: the first lock of a set is made by it, the others as it
    made that one), then only each lock's resources. Each value's class is part of its key:
    ``True == 1 == 1.0`` as keys, but ``ttl=True`` is refused where ``ttl=1`` is not.
    (The table saves 9.0k instructions a lock, 2.2% of a ``with redlock(r)`` cycle.)"""
    engine = get_redlock()
    owner, table = _presets
    key = (
        ttl, type(ttl), wait, type(wait), label, type(label), db_guard, type(db_guard),
        template, type(template), release_before_commit, type(release_before_commit),
    )  # fmt: skip
    try:
        preset = table.get(key) if owner is engine else None
    except TypeError:  # an unhashable value: refused by DjangoLock below, not kept
        preset = None
    if preset is None:
        own = layer(db_guard, template, release_before_commit)
        lock = DjangoLock(
            engine,
            *resources,
            ttl=engine.ttl if ttl is None else ttl,
            wait=engine.wait if wait is None else wait,
            label=label,
        )
        lock._layer = own
        prefix = engine.lock_prefix
        _keep(engine, key, _Preset(prefix, lock.ttl, lock.wait, lock._options, own))
        return lock
    prefix, ttl, wait, options, own = preset
    made = DjangoLock.checked_apart(engine, resources, prefix, ttl, wait, options)
    made._layer = own
    return made


def _keep(engine: Redlock, key: tuple[object, ...], preset: _Preset) -> None:
    global _presets
    owner, table = _presets
    if owner is not engine or len(table) >= PRESETS_KEPT:
        owner, table = _presets = (engine, {})
    try:
        table[key] = preset
    except TypeError:  # a valid value that cannot be hashed (a float subclass with __eq__ only)
        pass  # its locks are each made in full, as before the table


def with_options(
    resources: tuple[str, ...],
    ttl: float | None,
    wait: float | None,
    label: str | None,
    auto_extend: bool,
    max_extensions: int | None,
    max_hold: float | None,
    reentrant: bool,
    on_lost: Callable[[Lock, LockLost], None] | None,
    at_least: float | None,
    at_most: float | None,
    limit: int | None,
    shared: bool,
    db_guard: bool,
    template: str | None,
    release_before_commit: bool,
) -> DjangoLock:
    """``redlock(*resources, ...)`` with any other option than ``plain()`` takes: a lock, a
    semaphore's permit or a reader, every option checked (``ValueError`` naming a bad one)."""
    mode = check_mode(limit, shared, reentrant)  # bad combinations: before anything else
    check_bounds_for(mode, at_least, at_most)
    own = layer(db_guard, template, release_before_commit)
    engine = get_redlock()
    lock = django_lock_class(mode)(
        engine,
        *resources,
        ttl=engine.ttl if ttl is None else ttl,
        wait=engine.wait if wait is None else wait,
        label=label,
        auto_extend=auto_extend,
        max_extensions=max_extensions,
        max_hold=max_hold,
        reentrant=reentrant,
        on_lost=on_lost,
        at_least=at_least,
        at_most=at_most,
        **({} if limit is None else {"limit": limit}),
    )
    lock._layer = own
    return lock


class DjangoPermitLock(DjangoLock, PermitLock):
    """A semaphore's permit (``limit=N``), guarded and traced as a ``DjangoLock``."""


class DjangoReaderLock(DjangoLock, ReaderLock):
    """A reader (``shared=True``), guarded and traced as a ``DjangoLock``. Released at its
    block's end even inside a transaction: it protects reads, which are done by then, and the
    same thread may then take the writer of the same name in that transaction."""

    waits_for_transaction = False


def django_lock_class(mode: type[Lock]) -> type[DjangoLock]:
    """The Django layer's handle for the engine's handle class ``mode`` (``engine.modes``)."""
    if issubclass(mode, PermitLock):
        return DjangoPermitLock
    if issubclass(mode, ReaderLock):
        return DjangoReaderLock
    return DjangoLock
