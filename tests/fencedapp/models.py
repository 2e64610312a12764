from django.db import models


class Ledger(models.Model):
    """A resource protected by fencing tokens: ``fence`` is the token of the last accepted write."""

    name = models.CharField(max_length=40, unique=True)
    value = models.IntegerField(default=0)
    fence = models.BigIntegerField(default=0)

    class Meta:
        app_label = "fencedapp"

    def __str__(self) -> str:
        return f"{self.name}={self.value} (fence {self.fence})"
