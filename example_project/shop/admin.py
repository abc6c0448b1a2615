from __future__ import annotations

from django.contrib import admin

from django_redislock.admin import EditLeaseMixin

from .models import SKU, Order


@admin.register(SKU)
class SKUAdmin(EditLeaseMixin, admin.ModelAdmin):
    """One editor per SKU at a time: others see who edits it and since when
    (docs/edit-lease.md)."""

    list_display = ["code", "title", "price", "stock"]
    search_fields = ["code", "title"]


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["pk", "sku", "quantity", "buyer", "created_at"]
    list_filter = ["sku"]
    list_select_related = ["sku"]
