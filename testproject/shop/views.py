"""Demo views: money moves between accounts, and seats are booked, under a Redlock.

Both deliberately read, pause and write without any database locking, the way a careless view
would: only the lock keeps concurrent requests from losing money or selling a seat twice. The
``unsafe`` variants skip the lock so the difference can be seen. Every database access of a locked
request happens under the lock (SQLite in the tests shares one in-memory database between
threads, and it refuses concurrent access to a table instead of waiting).

- ``transfer`` uses ``redlock()`` directly, on exactly the two accounts it moves money between
  (one lock over both: all or none, so two transfers in opposite directions cannot deadlock).
- ``book`` uses ``@lock_view("show:{show_id}")``: one lock per show, from the URL kwarg, so
  bookings for different shows run in parallel.
"""

from __future__ import annotations

import random
import time

from django.db.models import Count, Sum
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_POST

from django_redlock import LockNotAcquired, redlock
from django_redlock.contrib import prometheus
from django_redlock.decorators import lock_view

from .models import Account, Show, Ticket

DEMO_ACCOUNTS = {"alice": 1000, "bob": 1000, "carol": 1000}
DEMO_SHOWS = {"Matinee": 40, "Evening": 40}


def ensure_accounts() -> None:
    for name, balance in DEMO_ACCOUNTS.items():
        Account.objects.get_or_create(name=name, defaults={"balance": balance})


def ensure_shows() -> None:
    for name, seats in DEMO_SHOWS.items():
        Show.objects.get_or_create(name=name, defaults={"seats": seats})


def index(request: HttpRequest) -> HttpResponse:
    ensure_accounts()
    accounts = Account.objects.order_by("name")
    total = accounts.aggregate(total=Sum("balance"))["total"]
    return render(
        request,
        "shop/index.html",
        {
            "accounts": accounts,
            "total": total,
            "expected": sum(DEMO_ACCOUNTS.values()),
        },
    )


def balances(request: HttpRequest) -> JsonResponse:
    """The accounts and their total now: the page reads it before and after each run, to show
    what that run did to the total."""
    ensure_accounts()
    accounts = {a.name: a.balance for a in Account.objects.order_by("name")}
    return JsonResponse({"accounts": accounts, "total": sum(accounts.values())})


def _move(amount: int, source_name: str, target_name: str) -> None:
    source = Account.objects.get(name=source_name)
    target = Account.objects.get(name=target_name)
    source.balance -= amount
    time.sleep(0.02)  # the window in which a concurrent transfer would overwrite ours
    target.refresh_from_db()
    target.balance += amount
    source.save(update_fields=["balance"])
    target.save(update_fields=["balance"])


@require_POST
def transfer(request: HttpRequest) -> JsonResponse:
    amount = random.randint(1, 50)  # noqa: S311 (demo)
    source, target = random.sample(sorted(DEMO_ACCOUNTS), 2)  # noqa: S311 (demo)
    if request.GET.get("unsafe"):
        ensure_accounts()
        _move(amount, source, target)
        return JsonResponse({"ok": True, "locked": False})
    try:
        accounts = (f"account:{source}", f"account:{target}")
        with redlock(*accounts, ttl=5, wait=5, label="transfer view") as lock:
            ensure_accounts()
            _move(amount, source, target)
            left = round(lock.validity, 3)
            return JsonResponse({"ok": True, "locked": True, "validity_left": left})
    except LockNotAcquired as exc:
        return JsonResponse({"ok": False, "error": str(exc)}, status=503)


@require_POST
def reset(request: HttpRequest) -> JsonResponse:
    Account.objects.all().delete()
    ensure_accounts()
    return JsonResponse({"ok": True})


# --- seats ---------------------------------------------------------------------------------------


def seats(request: HttpRequest) -> HttpResponse:
    ensure_shows()
    shows = Show.objects.order_by("name").annotate(sold=Count("tickets"))
    rows = []
    for show in shows:
        taken = set(show.tickets.values_list("seat", flat=True))
        rows.append({"show": show, "sold": show.sold, "double": show.sold - len(taken)})
    return render(request, "shop/seats.html", {"rows": rows})


def _book_a_seat(show_id: int) -> JsonResponse:
    show = get_object_or_404(Show, pk=show_id)
    taken = set(show.tickets.values_list("seat", flat=True))
    free = [seat for seat in range(1, show.seats + 1) if seat not in taken]
    if not free:
        return JsonResponse({"ok": False, "error": "sold out"}, status=409)
    time.sleep(0.02)  # the window in which a concurrent booking would pick the same seat
    ticket = Ticket.objects.create(show=show, seat=free[0])
    return JsonResponse({"ok": True, "seat": ticket.seat})


@require_POST
@lock_view("show:{show_id}", ttl=5, wait=5, label="book a seat")
def book(request: HttpRequest, show_id: int) -> JsonResponse:
    """One booking at a time per show; a request waits up to 5 s for its turn, then gets 423."""
    return _book_a_seat(show_id)


@require_POST
def book_unsafe(request: HttpRequest, show_id: int) -> JsonResponse:
    return _book_a_seat(show_id)


@require_POST
def reset_seats(request: HttpRequest) -> JsonResponse:
    Ticket.objects.all().delete()
    ensure_shows()
    return JsonResponse({"ok": True})


def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus metrics of this process (``prometheus_client``, in the dev extra)."""
    if not prometheus.enabled():  # also registers our collectors before the first lock
        raise Http404("prometheus_client is not installed")
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
