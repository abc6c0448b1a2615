"""Demo data for the example shop, and a demo admin login printed for you."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from example_project.shop.models import SKU

DEMO_USERNAME = "admin"
DEMO_PASSWORD = "redislock-demo"

SKUS = [
    ("concert-ticket", "Concert ticket", "49.00", 10),
    ("limited-sneaker", "Limited sneaker", "180.00", 3),
    ("coffee-beans", "Coffee beans 1 kg", "24.50", 100),
]


class Command(BaseCommand):
    help = "Create the demo SKUs (if missing) and the demo admin login, and print the login."

    def handle(self, *args: Any, **options: Any) -> None:
        created = 0
        for code, title, price, stock in SKUS:
            _, was_created = SKU.objects.get_or_create(
                code=code, defaults={"title": title, "price": Decimal(price), "stock": stock}
            )
            created += was_created
        user_model = get_user_model()
        user, _ = user_model.objects.get_or_create(
            **{user_model.USERNAME_FIELD: DEMO_USERNAME},
            defaults={"is_staff": True, "is_superuser": True},
        )
        user.is_staff = user.is_superuser = True
        user.set_password(DEMO_PASSWORD)
        user.save()
        self.stdout.write(f"Demo data: {created} SKU(s) created, {SKU.objects.count()} in total.")
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo admin login: username {DEMO_USERNAME!r}, password {DEMO_PASSWORD!r} "
                "(at /admin/ on the shop's address)"
            )
        )
