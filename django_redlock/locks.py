"""The lock the Django layer hands out (``redlock()``, ``@locked``, ``lock_view``, guarded
commands): the engine's ``Lock``, plus the DB guard around its blocks (``dbguard.py``) and
OpenTelemetry spans around its operations (``otel.py``, when installed). The engine's own
``Lock`` (``Redlock(...).lock()``) has neither: the engine stays Django-free."""

from __future__ import annotations

from collections.abc import Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import dbguard, otel
from .engine import Lock
from .engine.leases import current_owner
from .metrics import UNTEMPLATED

if TYPE_CHECKING:
    from .engine import Redlock


class DjangoLock(Lock):
    """A ``Lock`` whose ``with`` / ``async with`` block is guarded (unless ``db_guard=False``):
    once its lease is lost or its validity is over, the block's next query raises
    ``LockLost``; and whose acquire, extend and release are traced when OpenTelemetry is
    installed."""

    def __init__(
        self,
        redlock: Redlock,
        *resources: str,
        db_guard: bool = True,
        template: str | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(db_guard, bool):
            raise ValueError(f"db_guard must be True or False, got {db_guard!r}")
        if template is not None and (not isinstance(template, str) or not template):
            raise ValueError(f"template must be a non-empty str or None, got {template!r}")
        super().__init__(redlock, *resources, **options)
        self.db_guard = db_guard
        #: The label of the per-template metrics (never the formatted resource: unbounded).
        self.template = template or UNTEMPLATED

    # --- the DB guard: the block --------------------------------------------------------------

    def __enter__(self) -> DjangoLock:
        super().__enter__()
        self._guard()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._callers.get(current_owner())
        try:
            super().__exit__(exc_type, exc, tb)
        finally:
            if lease is not None:
                dbguard.unguard(lease)

    async def __aenter__(self) -> DjangoLock:
        await super().__aenter__()
        self._guard()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._callers.get(current_owner())
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            if lease is not None:
                dbguard.unguard(lease)

    def _guard(self) -> None:
        lease = self._callers.get(current_owner())
        if self.db_guard and lease is not None:
            dbguard.install_here()
            dbguard.guard(lease)

    # --- spans: the operations ------------------------------------------------------------------

    def acquire(self) -> DjangoLock:
        tracer = otel.tracer()
        if tracer is None:
            super().acquire()
        else:
            with otel.operation(tracer, "redlock.acquire", self):
                super().acquire()
        return self

    def aacquire(self) -> Coroutine[Any, Any, Lock]:
        tracer = otel.tracer()
        if tracer is None:
            return super().aacquire()
        return self._traced(tracer, "redlock.acquire", super().aacquire())

    def extend(self, ttl: float | None = None) -> float:
        tracer = otel.tracer()
        if tracer is None:
            return super().extend(ttl)
        with otel.operation(tracer, "redlock.extend", self):
            return super().extend(ttl)

    async def aextend(self, ttl: float | None = None) -> float:
        tracer = otel.tracer()
        if tracer is None:
            return await super().aextend(ttl)
        with otel.operation(tracer, "redlock.extend", self):
            return await super().aextend(ttl)

    def release(self) -> None:
        tracer = otel.tracer()
        if tracer is None:
            super().release()
        else:
            with otel.operation(tracer, "redlock.release", self):
                super().release()

    def arelease(self) -> Coroutine[Any, Any, None]:
        tracer = otel.tracer()
        if tracer is None:
            return super().arelease()
        return self._traced(tracer, "redlock.release", super().arelease())

    async def _traced(self, tracer: Any, name: str, operation: Coroutine[Any, Any, Any]) -> Any:
        # The coroutine was made by the caller (it bound the caller's task as the owner).
        with otel.operation(tracer, name, self):
            return await operation
