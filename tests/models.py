"""Models the test suite writes to."""

from __future__ import annotations

from django.db import models

from django_redislock.fencing import FenceField
from django_redislock.models import InventoryMixin


class FencedRecord(models.Model):
    """A row guarded by fencing tokens (``django_redislock.fencing``)."""

    value = models.CharField(max_length=100, default="")
    writes = models.IntegerField(default=0)
    fence = FenceField()

    def __str__(self) -> str:
        return f"{self.value} (fence {self.fence})"


class FencedChild(FencedRecord):
    """A multi-table-inheritance child: its fence lives in ``FencedRecord``'s table."""

    note = models.CharField(max_length=20, default="")


class _Published(models.Manager["PublishedRecord"]):
    def get_queryset(self) -> models.QuerySet[PublishedRecord]:
        return super().get_queryset().exclude(value="")


class PublishedRecord(FencedRecord):
    """A default manager that hides some rows, as a soft-delete manager does."""

    published = _Published()

    class Meta:
        proxy = True
        default_manager_name = "published"


class Item(InventoryMixin):
    """Stock in the default ``stock`` field."""

    title = models.CharField(max_length=50, default="")


class SpecialItem(Item):
    """A multi-table-inheritance child: its stock lives in ``Item``'s table."""

    note = models.CharField(max_length=20, default="")


class ProxyItem(Item):
    class Meta:
        proxy = True


class Uncapped(InventoryMixin):
    """Stock in a plain ``IntegerField``: no CHECK constraint, so only the
    guarded write keeps it from going below zero."""

    stock = models.IntegerField(default=0)


class UncappedChild(Uncapped):
    """A multi-table-inheritance child: its stock lives in ``Uncapped``'s table."""


class Gadget(InventoryMixin):
    """Stock kept in a field of another name."""

    stock_field = "on_hand"
    stock = None  # type: ignore[assignment]
    on_hand = models.PositiveIntegerField(default=0, db_column="On Hand")  # quoting
    inventory_lock_options = {"blocking_timeout": 0.2}


class Order(models.Model):  # noqa: DJ008
    item = models.ForeignKey(Item, on_delete=models.CASCADE)
    quantity = models.PositiveIntegerField()


class Account(models.Model):  # noqa: DJ008
    """A row read, changed in Python and saved: docs/quickstart.md's lost-update recipe."""

    points = models.IntegerField(default=0)


class NemesisRegister(models.Model):
    """A counter the nemesis run's workers read, increment and write back under a
    lock (``tests/faults/nemesis``): one row per guarded resource."""

    name = models.CharField(max_length=50, unique=True)
    value = models.IntegerField(default=0)
    fence = FenceField()

    def __str__(self) -> str:
        return f"{self.name}={self.value} (fence {self.fence})"


class NemesisWrite(models.Model):  # noqa: DJ008
    """One accepted write to a ``NemesisRegister``, inserted in the write's own
    transaction: the database's record of what was applied, for the checker."""

    register = models.CharField(max_length=50)
    value = models.IntegerField()
    token = models.BigIntegerField(null=True)
    op = models.CharField(max_length=40)


class Brochure(models.Model):
    """An object edited in the admin under an edit lease (``tests/editing``)."""

    title = models.CharField(max_length=100)
    body = models.TextField(blank=True)

    def __str__(self) -> str:
        return self.title


class BrochurePage(models.Model):
    """An inline of ``Brochure``: read only too for whoever does not hold the lease."""

    brochure = models.ForeignKey(Brochure, on_delete=models.CASCADE, related_name="pages")
    text = models.CharField(max_length=100)

    def __str__(self) -> str:
        return self.text
