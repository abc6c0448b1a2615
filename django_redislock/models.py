"""Models: ``HeldLock`` gives the admin dashboard its place and its permission."""

from __future__ import annotations

from django.db import models
from django.utils.translation import gettext_lazy as _


class HeldLock(models.Model):
    """A held primitive, as shown by the admin dashboard; never stored.

    Unmanaged, with no table: it exists so the dashboard has an entry in the
    admin index and a ``release_lock`` permission that can be granted to staff
    (its migration creates the permission row, not a table). Force-releases
    are logged in the admin log against instances of it.
    """

    name = models.CharField(_("name"), max_length=1024, primary_key=True)

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("release_lock", _("Can force-release held locks"))]
        verbose_name = _("held lock")
        verbose_name_plural = _("held locks")

    def __str__(self) -> str:
        return self.name
