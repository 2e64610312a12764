"""The admin's "Held locks" page and its force release, served through ``HeldLockAdmin``.

Listing needs ``view_held_locks``; force release needs ``force_release_lock``. GET never changes
anything: the release link leads to a confirmation page naming the holder, and only its POST (with
the CSRF token) deletes, by compare-and-delete, exactly the holder shown there.

The link and the form name the resource by an opaque reference (``resource_ref``), not by the
name itself: a browser rewrites a newline in a form field as CR LF, so a name that carries one
would otherwise come back as another resource.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import reverse

from . import conf
from .engine.base import protocol
from .models import HeldLock as HeldLockModel
from .operations import force_release, health, inventory
from .operations.held import Copy, HeldLock, Owner

if TYPE_CHECKING:
    from django.contrib.admin import AdminSite
    from django.db.models.options import Options


class HeldLockAdmin(Protocol):
    """What these views need of the model admin that serves them (``admin.HeldLockAdmin``):
    named here, so that admin imports views and never the other way round."""

    admin_site: AdminSite
    opts: Options[HeldLockModel]

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool: ...

    def has_force_release_permission(self, request: HttpRequest) -> bool: ...


PAGE_SIZE = 50


@dataclass(frozen=True)
class LockRow:
    """One held lock as the page shows it."""

    lock: HeldLock
    acquired_at: datetime | None
    release_url: str


def held_locks(request: HttpRequest, model_admin: HeldLockAdmin) -> HttpResponse:
    """Every lock held across the masters (one page of them), and how each master is doing."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    search = request.GET.get("q", "")[: inventory.MAX_SEARCH]
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "title": "Held locks",
        "opts": model_admin.opts,
        "search": search,
        "can_release": model_admin.has_force_release_permission(request),
    }
    try:
        redlock = conf.get_redlock()
    except ImproperlyConfigured as exc:
        context["config_error"] = str(exc)
        return TemplateResponse(request, "admin/django_redlock/held_locks.html", context)
    found = inventory.list_locks(
        redlock, search=search, page=_page_number(request.GET.get("p")), page_size=PAGE_SIZE
    )
    release = reverse(f"{model_admin.admin_site.name}:django_redlock_heldlock_release")
    status = health.probe_all(redlock)
    shared = _shared_warnings(status)
    context.update(
        health=status,
        node_rows=[(n, [w for w in n.warnings if w not in shared]) for n in status.nodes],
        shared_warnings=shared,
        node_timeout=redlock.node_timeout,
        inventory=found,
        rows=[
            LockRow(lock, _datetime(lock.acquired_at), _release_url(release, lock))
            for lock in found.locks
        ],
        previous_url=_page_url(search, found.page - 1) if found.has_previous else None,
        next_url=_page_url(search, found.page + 1) if found.has_next else None,
    )
    return TemplateResponse(request, "admin/django_redlock/held_locks.html", context)


def release(request: HttpRequest, model_admin: HeldLockAdmin) -> HttpResponse:
    """GET: confirm, naming the holder. POST: compare-and-delete that holder on every master."""
    if not model_admin.has_force_release_permission(request):
        raise PermissionDenied
    if request.method not in ("GET", "POST"):
        return HttpResponseNotAllowed(["GET", "POST"])
    data = request.POST if request.method == "POST" else request.GET
    refs = data.getlist("ref")[:MAX_RESOURCES_PER_RELEASE] or [""]
    fingerprint = data.get("fingerprint", "")
    raw_slot = data.get("slot")
    try:
        # A lock over several resources is released as one: every resource, the same holder.
        resources = [resource_from_ref(ref) for ref in refs]
        force_release.check_fingerprint(fingerprint)
        slot = None if raw_slot is None else slot_from(raw_slot, resources)
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    resource = resources[0]
    redlock = conf.get_redlock()
    changelist = reverse(f"{model_admin.admin_site.name}:django_redlock_heldlock_changelist")
    if request.method == "POST":
        for each in resources:
            result = force_release.force_release(redlock, each, fingerprint, slot=slot)
            if result.owner is None:
                messages.warning(request, result.describe())
            else:
                _log(request, result)
                level = messages.SUCCESS if result.released_on else messages.WARNING
                messages.add_message(request, level, result.describe())
        return HttpResponseRedirect(changelist)
    lock = inventory.inspect(redlock, resource, slot=slot)
    copies: list[Copy] = [c for c in lock.copies if c.fingerprint == fingerprint] if lock else []
    owner: Owner | None = copies[0].owner if copies else None
    context = {
        **model_admin.admin_site.each_context(request),
        "title": "Force release a lock",
        "opts": model_admin.opts,
        "resource": " + ".join(resources) if slot is None else f"{resource}#{slot}",
        "refs": refs,
        "slot": slot,
        "fingerprint": fingerprint,
        "lock": lock,
        "copies": copies,
        "owner": owner,
        "acquired_at": _datetime(owner.since) if owner else None,
        "changelist_url": changelist,
    }
    return TemplateResponse(request, "admin/django_redlock/confirm_release.html", context)


def _log(request: HttpRequest, result: force_release.ForceRelease) -> None:
    """An admin LogEntry (a deletion) on the placeholder model's content type: the resource is the
    object id, the per-master outcome the message. There is no row to point at, and the admin
    shows deletions without a link, which is right for a lock that no longer exists."""
    user = request.user
    if not user.is_authenticated:  # admin_view lets only staff in; this keeps the types honest
        raise PermissionDenied
    LogEntry.objects.create(
        user_id=user.pk,
        content_type=ContentType.objects.get_for_model(HeldLockModel, for_concrete_model=False),
        object_id=result.resource,
        object_repr=f"{result.resource} (holder {result.fingerprint})"[:200],
        action_flag=DELETION,
        change_message=result.describe(),
    )


def _shared_warnings(status: health.Health) -> list[str]:
    """Warnings every reachable master has (the same setting everywhere): said once, under the
    table, also while some master is down."""
    reachable = [n for n in status.nodes if n.reachable]
    if len(reachable) < 2:
        return []
    first, *others = reachable
    return [w for w in first.warnings if all(w in n.warnings for n in others)]


def resource_ref(resource: str) -> str:
    """An opaque, form-safe name for ``resource``: its UTF-8 bytes in unpadded base64url."""
    return base64.urlsafe_b64encode(resource.encode()).decode().rstrip("=")


def resource_from_ref(ref: str) -> str:
    """The resource ``ref`` names, or ``ValueError`` (also for a name the API refuses)."""
    try:
        raw = base64.b64decode(ref + "=" * (-len(ref) % 4), altchars=b"-_", validate=True)
        resource = raw.decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError(f"ref is not a resource reference: {ref[:80]!r}") from None
    return protocol.check_resource(resource)


#: A force release names at most this many resources (one lock over several).
MAX_RESOURCES_PER_RELEASE = 64


def slot_from(raw: str, resources: list[str]) -> int:
    """The permit slot a release names (``slot=``: one semaphore's permit), or ``ValueError``."""
    if len(resources) != 1 or not raw.isascii() or not raw.isdigit():
        raise ValueError(f"slot must be a permit's number, of one semaphore, got {raw[:20]!r}")
    return inventory.check_slot(int(raw))


def _release_url(base: str, lock: HeldLock) -> str:
    """A permit is named by its semaphore and slot: its shown name may be a plain lock's too."""
    if lock.slot is not None:
        query = [("ref", resource_ref(lock.group)), ("slot", str(lock.slot))]
    else:
        query = [("ref", resource_ref(name)) for name in lock.names]
    return f"{base}?{urlencode([*query, ('fingerprint', lock.fingerprint)])}"


def _page_number(raw: str | None) -> int:
    try:
        return max(1, int(raw or 1))
    except ValueError:
        return 1


def _page_url(search: str, page: int) -> str:
    return "?" + urlencode({**({"q": search} if search else {}), "p": page})


def _datetime(unix_seconds: float | None) -> datetime | None:
    if unix_seconds is None:
        return None
    try:
        return datetime.fromtimestamp(unix_seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
