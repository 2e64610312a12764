from django.db import models


class Account(models.Model):
    """A bank account of the demo: transfers between accounts must never create or lose money."""

    name = models.CharField(max_length=40, unique=True)
    balance = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}: {self.balance}"
