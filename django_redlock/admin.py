"""The "Held locks" entry of the admin: no table behind it (see models.HeldLock).

Only two URLs exist: the list (``changelist_view`` renders ``views.held_locks``) and the force
release (``views.release``); none of the admin's add/change/delete/history views.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path

from . import views
from .models import HeldLock

VIEW_PERMISSION = "django_redlock.view_held_locks"
RELEASE_PERMISSION = "django_redlock.force_release_lock"

if TYPE_CHECKING:
    ModelAdmin = admin.ModelAdmin[HeldLock]
else:  # Django's ModelAdmin is generic only in django-stubs, not at runtime
    ModelAdmin = admin.ModelAdmin


@admin.register(HeldLock)
class HeldLockAdmin(ModelAdmin):
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW_PERMISSION)

    def has_force_release_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(RELEASE_PERMISSION)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path("", self.admin_site.admin_view(self.changelist_view), name=f"{name}_changelist"),
            path("release/", self.admin_site.admin_view(self.release_view), name=f"{name}_release"),
        ]

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        return views.held_locks(request, self)

    def release_view(self, request: HttpRequest) -> HttpResponse:
        return views.release(request, self)
