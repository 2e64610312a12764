"""One holder of the "held until the transaction ends" chaos scenario (tests/test_txn_chaos.py), in
its own process so that it can be SIGSTOPped for real. Driven over stdin/stdout, one line each:

    python -m tests.txn_writer <ttl>    (REDLOCK_NODES and REDLOCK_TEST_PG in the environment)

Says ``READY`` (after migrating, with ``ATOMIC_REQUESTS`` on), then:
    ``reset``  -> ``OK``: the counter row back to 0
    ``add <view|with> <default|early> <pause|go>``
               -> one increment of the counter (read, +1, save) under the lock "txn-chaos":
                  ``view``: a POST through ``lock_view`` (the transaction is ``ATOMIC_REQUESTS``'s);
                  ``with``: ``with redlock()`` inside the caller's ``transaction.atomic()``.
                  ``early``: with ``release_before_commit=True``. With ``pause``, once the lock's
                  block has ended but before the transaction commits, a JSON line ``{"pid": ...}``
                  and a wait for one more line (the test SIGSTOPs us there). Then a JSON line: the
                  section as bench.chaos.checkers.Section records it (``counted``: committed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402
from django.conf import settings  # noqa: E402

settings.ROOT_URLCONF = __name__
django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.test import Client  # noqa: E402
from django.urls import path  # noqa: E402

from django_redlock import LockLost, lock_view, redlock  # noqa: E402
from django_redlock.conf import get_redlock  # noqa: E402
from tests.fencedapp.models import Ledger  # noqa: E402

ROW = "txn-chaos"
TTL = float(sys.argv[1]) if __name__ == "__main__" and len(sys.argv) > 1 else 1.0

#: What the running section recorded (one section at a time per process).
record: dict[str, Any] = {}


def increment() -> None:
    """The critical section: read the counter, +1, save (never an F() expression: that could
    not lose an update). Records its times as the checkers want them: ``released`` is read
    at the block's end, before the lock is let go (sound: never after it)."""
    engine = get_redlock()
    record["acquired"] = time.monotonic()
    record["valid_until"] = engine.holders[engine.lock_key(ROW)].valid_until
    row = Ledger.objects.get(name=ROW)
    time.sleep(0.02)
    row.value += 1
    row.save(update_fields=["value"])
    record["released"] = time.monotonic()


def window() -> None:
    """The lock's block has ended, its transaction not yet committed: stop here if asked."""
    if record.pop("pause"):
        print(json.dumps({"pid": os.getpid()}), flush=True)
        sys.stdin.readline()


def counted_view(request: HttpRequest, name: str) -> HttpResponse:
    increment()
    return HttpResponse("added")


def paused(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Inside ``ATOMIC_REQUESTS``'s transaction, around the decorated view."""

    def after_the_view(request: HttpRequest, name: str) -> HttpResponse:
        response = view(request, name)
        window()
        return response

    return after_the_view


urlpatterns = [
    path(
        "view/default/<str:name>/", paused(lock_view("txn-chaos", ttl=TTL, wait=30)(counted_view))
    ),
    path(
        "view/early/<str:name>/",
        paused(lock_view("txn-chaos", ttl=TTL, wait=30, release_before_commit=True)(counted_view)),
    ),
]


def add(how: str, mode: str, pause: bool) -> dict[str, Any]:
    record.clear()
    record.update(pause=pause, counted=False, fence=None, fenced=None, wrote_at=None)
    early = mode == "early"
    if how == "view":
        response = Client(raise_request_exception=False).post(f"/view/{mode}/{ROW}/")
        record["counted"] = response.status_code == 200
        record["note"] = "" if record["counted"] else f"HTTP {response.status_code}"
    else:
        try:
            with transaction.atomic():
                lock = redlock(ROW, ttl=TTL, wait=30, auto_extend=True, release_before_commit=early)
                with lock:
                    increment()
                window()
            record["counted"] = True
        except LockLost as error:  # CommitRefused: rolled back instead of committed
            record["note"] = f"{type(error).__name__}: {error}"
    record["lost"] = not record["counted"]
    return record


def main() -> None:
    call_command("migrate", run_syncdb=True, verbosity=0)
    connections.settings["default"]["ATOMIC_REQUESTS"] = True
    print("READY", flush=True)
    for line in sys.stdin:
        command, *config = line.split()
        if command == "reset":
            Ledger.objects.update_or_create(name=ROW, defaults={"value": 0, "fence": 0})
            print("OK", flush=True)
        elif command == "add":
            how, mode, pause = config
            print(json.dumps(add(how, mode, pause == "pause")), flush=True)


if __name__ == "__main__":
    main()
