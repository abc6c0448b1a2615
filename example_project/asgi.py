"""ASGI entry point: ``uvicorn --workers 4 example_project.asgi:application``
(from the repository root, with ``REDIS_URL`` set: see docs/example.md)."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
application = get_asgi_application()
