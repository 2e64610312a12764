from django.db import models

from django_redlock.fencing import FencedModel


class Ledger(models.Model):
    """A resource protected by fencing tokens: ``fence`` is the token of the last accepted write."""

    name = models.CharField(max_length=40, unique=True)
    value = models.IntegerField(default=0)
    fence = models.BigIntegerField(default=0)

    class Meta:
        app_label = "fencedapp"

    def __str__(self) -> str:
        return f"{self.name}={self.value} (fence {self.fence})"


class Account(FencedModel):
    """A row guarded by ``FencedModel``: its ``save(fence=...)`` and ``update(..., fence=...)``
    refuse an older holder."""

    name = models.CharField(max_length=40, unique=True)
    balance = models.IntegerField(default=0)
    touched = models.DateTimeField(auto_now=True)

    class Meta:
        app_label = "fencedapp"

    def __str__(self) -> str:
        return f"{self.name}={self.balance} (fence {self.fence})"
