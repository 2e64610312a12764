"""Demo views: money moves between accounts under a Redlock.

The transfer deliberately reads, pauses and writes without any database locking, the way a
careless view would: only the lock keeps concurrent transfers from losing money. Try
``?unsafe=1`` to see what happens without it.
"""

from __future__ import annotations

import random
import time

from django.db.models import Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_POST

from django_redlock import LockNotAcquired, redlock

from .models import Account

DEMO_ACCOUNTS = {"alice": 1000, "bob": 1000, "carol": 1000}


def ensure_accounts() -> None:
    for name, balance in DEMO_ACCOUNTS.items():
        Account.objects.get_or_create(name=name, defaults={"balance": balance})


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


def _move(amount: int) -> None:
    source, target = random.sample(list(Account.objects.all()), 2)  # noqa: S311 (demo)
    source.balance -= amount
    time.sleep(0.02)  # the window in which a concurrent transfer would overwrite ours
    target.refresh_from_db()
    target.balance += amount
    source.save(update_fields=["balance"])
    target.save(update_fields=["balance"])


@require_POST
def transfer(request: HttpRequest) -> JsonResponse:
    ensure_accounts()
    amount = random.randint(1, 50)  # noqa: S311 (demo)
    if request.GET.get("unsafe"):
        _move(amount)
        return JsonResponse({"ok": True, "locked": False})
    try:
        with redlock("shop:accounts", ttl=5, wait=5, label="transfer view") as lock:
            _move(amount)
            left = round(lock.validity, 3)
            return JsonResponse({"ok": True, "locked": True, "validity_left": left})
    except LockNotAcquired as exc:
        return JsonResponse({"ok": False, "error": str(exc)}, status=503)


@require_POST
def reset(request: HttpRequest) -> JsonResponse:
    Account.objects.all().delete()
    ensure_accounts()
    return JsonResponse({"ok": True})
