"""``runserver`` that says once which Redis the shop uses."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.staticfiles.management.commands import runserver
from django.utils.autoreload import DJANGO_AUTORELOAD_ENV

from example_project import embedded_redis


class Command(runserver.Command):
    def handle(self, *args: Any, **options: Any) -> None:
        # Not again in the autoreloader's child, which restarts on every code change.
        message = embedded_redis.announcement()
        if message and os.environ.get(DJANGO_AUTORELOAD_ENV) != "true":
            self.stdout.write(self.style.WARNING(message))
            self.stdout.flush()  # the autoreloader's parent then waits on its child
        super().handle(*args, **options)
