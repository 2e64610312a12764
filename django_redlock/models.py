"""No tables: one placeholder model gives the admin its "Held locks" entry and the permissions.

Like django-rq's ``Queue``: ``managed = False`` (no table is ever created), no default
add/change/delete/view permissions, and two of our own, so that seeing locks and force-releasing
them can be granted separately.
"""

from django.db import models


class HeldLock(models.Model):
    """Placeholder for the admin page of locks held on the Redis masters (no rows, no table)."""

    id = models.AutoField(primary_key=True)

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_held_locks", "Can view held locks"),
            ("force_release_lock", "Can force-release a held lock"),
        ]
        verbose_name = "held lock"
        verbose_name_plural = "held locks"

    def __str__(self) -> str:
        return "held lock"
