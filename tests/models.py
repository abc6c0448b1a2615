"""Models the test suite writes to."""

from __future__ import annotations

from django.db import models

from django_redislock.fencing import FenceField


class FencedRecord(models.Model):
    """A row guarded by fencing tokens (``django_redislock.fencing``)."""

    value = models.CharField(max_length=100, default="")
    writes = models.IntegerField(default=0)
    fence = FenceField()

    def __str__(self) -> str:
        return f"{self.value} (fence {self.fence})"
