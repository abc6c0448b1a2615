from __future__ import annotations

from django.db import models

from django_redislock.models import InventoryMixin


class SKU(InventoryMixin):
    """Something for sale; ``stock`` and ``deduct()`` come from ``InventoryMixin``."""

    code = models.SlugField(unique=True)
    title = models.CharField(max_length=100)
    price = models.DecimalField(max_digits=8, decimal_places=2)

    class Meta:
        ordering = ["code"]
        verbose_name = "SKU"

    def __str__(self) -> str:
        return f"{self.title} ({self.code})"


class Order(models.Model):
    sku = models.ForeignKey(SKU, on_delete=models.PROTECT, related_name="orders")
    quantity = models.PositiveIntegerField(default=1)
    buyer = models.CharField(max_length=100, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"#{self.pk}: {self.quantity} x {self.sku.code}"
