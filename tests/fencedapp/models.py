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


class Owner(models.Model):
    """Whose accounts: fenced updates filter across this relation (a join)."""

    name = models.CharField(max_length=40, unique=True)

    class Meta:
        app_label = "fencedapp"

    def __str__(self) -> str:
        return self.name


class OwnedAccount(FencedModel):
    """A fenced row selected through a relation: ``filter(owner__name=...)`` is a join."""

    owner = models.ForeignKey(Owner, on_delete=models.CASCADE)
    balance = models.IntegerField(default=0)

    class Meta:
        app_label = "fencedapp"

    def __str__(self) -> str:
        return f"{self.owner_id}:{self.pk}={self.balance} (fence {self.fence})"


class PremiumAccount(Account):
    """A multi-table child of a fenced model: its fence is in the parent's table."""

    level = models.IntegerField(default=0)

    class Meta:
        app_label = "fencedapp"


class BareAccount(Account):
    """A multi-table child that adds no fields: its own table has nothing to write."""

    class Meta:
        app_label = "fencedapp"


class Document(models.Model):
    """A plain parent, for ``Page``: the fence is in the child's table, not the parent's."""

    title = models.CharField(max_length=40, default="")

    class Meta:
        app_label = "fencedapp"

    def __str__(self) -> str:
        return self.title


class Page(FencedModel, Document):
    """A fenced multi-table child of a plain model (its own table holds the fence). FencedModel
    first: its manager (the fenced queryset) is then the default, not Document's."""

    words = models.IntegerField(default=0)

    class Meta:
        app_label = "fencedapp"

    def __str__(self) -> str:
        return f"{self.title} ({self.words} words, fence {self.fence})"
