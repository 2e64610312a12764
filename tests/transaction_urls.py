"""The views of tests/transaction_checks.py: a counter read, worked on for 20 ms and saved +1,
under ``lock_view`` (run by the checks with ``ATOMIC_REQUESTS`` on)."""

from __future__ import annotations

import time

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt

from django_redlock import lock_view
from tests.fencedapp.models import Ledger


def _count(name: str) -> HttpResponse:
    row = Ledger.objects.get(name=name)
    time.sleep(0.02)
    row.value += 1
    row.save()
    return HttpResponse(str(row.value))


@csrf_exempt
@lock_view("count:{name}", wait=30)
def count(request: HttpRequest, name: str) -> HttpResponse:
    return _count(name)


@csrf_exempt
@lock_view("count:{name}", wait=30, release_before_commit=True)
def count_early(request: HttpRequest, name: str) -> HttpResponse:
    return _count(name)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("count/<str:name>/", count),
    path("count-early/<str:name>/", count_early),
]
