"""Views that hold a lock across a pause, for the DB guard's and OpenTelemetry's tests: the
pause lets a test take the lease away (a force release) before the view writes."""

import asyncio
import time

from django.db.models import F
from django.http import HttpRequest, HttpResponse

from django_redlock import lock_view

from .models import Ledger


@lock_view("ledger:{name}", ttl=1.0)  # renewed every 1/3 s while it holds
def add_after_pause(request: HttpRequest, name: str) -> HttpResponse:
    """Read the row, pause ``?pause=`` seconds, then add one to it."""
    Ledger.objects.get(name=name)
    time.sleep(float(request.GET.get("pause", "0")))
    Ledger.objects.filter(name=name).update(value=F("value") + 1)
    return HttpResponse("added")


@lock_view("ledger:{name}", ttl=1.0)
async def aadd_after_pause(request: HttpRequest, name: str) -> HttpResponse:
    """The async twin: the ORM runs in sync_to_async's thread, not the event loop's."""
    await Ledger.objects.aget(name=name)
    await asyncio.sleep(float(request.GET.get("pause", "0")))
    await Ledger.objects.filter(name=name).aupdate(value=F("value") + 1)
    return HttpResponse("added")
