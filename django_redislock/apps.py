from __future__ import annotations

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class RedisLockConfig(AppConfig):
    name = "django_redislock"
    verbose_name = _("Redis locks")
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from django_redislock import checks  # noqa: F401 - registers the system checks
