from django.db import models


class Account(models.Model):
    """A bank account of the demo: transfers between accounts must never create or lose money."""

    name = models.CharField(max_length=40, unique=True)
    balance = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}: {self.balance}"


class Show(models.Model):
    """A show with numbered seats, for the seat-booking page."""

    name = models.CharField(max_length=60, unique=True)
    seats = models.PositiveIntegerField()

    def __str__(self) -> str:
        return self.name


class Ticket(models.Model):
    """One booked seat. Deliberately no unique (show, seat) constraint: in this demo only the lock
    keeps two concurrent bookings from selling the same seat. (A real app would add the
    constraint as well; the lock then spares the losers an IntegrityError and a retry.)"""

    show = models.ForeignKey(Show, on_delete=models.CASCADE, related_name="tickets")
    seat = models.PositiveIntegerField()

    def __str__(self) -> str:
        return f"{self.show} seat {self.seat}"
