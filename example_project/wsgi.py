"""WSGI entry point: ``gunicorn --workers 4 example_project.wsgi`` (from the
repository root, with ``REDIS_URL`` set: see docs/example.md)."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")
application = get_wsgi_application()
