from __future__ import annotations

from django.contrib import admin

from .models import SKU, Order


@admin.register(SKU)
class SKUAdmin(admin.ModelAdmin):
    list_display = ["code", "title", "price", "stock"]
    search_fields = ["code", "title"]


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["pk", "sku", "quantity", "buyer", "created_at"]
    list_filter = ["sku"]
    list_select_related = ["sku"]
