"""Admin sites for the edit lease's tests (``tests/editing``): ``ROOT_URLCONF`` here.

``/leased/``: ``Brochure`` under ``EditLeaseMixin`` with an inline and "save
as new", beside ``FencedRecord`` under a plain ``ModelAdmin``. ``/custom/``:
the same model with a custom change view and change form template.
``/open/``: an admin site that lets non-staff users in (a misconfiguration
the mixin refuses clearly).
"""

from __future__ import annotations

import threading
from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import path

from django_redislock.admin import EditLeaseMixin
from tests.models import Brochure, BrochurePage, FencedRecord

#: Set by a test to hold a save inside its transaction (``save_model``) until released.
SAVE_GATE: dict[str, threading.Event] = {}


class PageInline(admin.TabularInline):  # type: ignore[type-arg]
    model = BrochurePage
    extra = 1


class BrochureAdmin(EditLeaseMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    inlines = [PageInline]
    save_as = True
    edit_lease_timeout = 30.0

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        entered, proceed = SAVE_GATE.get("entered"), SAVE_GATE.get("proceed")
        if entered is not None and proceed is not None:
            entered.set()
            assert proceed.wait(30), "the test never let the save go on"
        super().save_model(request, obj, form, change)


class CustomBrochureAdmin(EditLeaseMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    change_form_template = "edit_lease_tests/custom_change_form.html"

    def change_view(
        self,
        request: HttpRequest,
        object_id: str,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        return super().change_view(request, object_id, form_url, {"custom_note": "custom view"})


class OpenSite(admin.AdminSite):
    def has_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active)


leased = admin.AdminSite(name="leased")
leased.register(Brochure, BrochureAdmin)
leased.register(FencedRecord)
custom = admin.AdminSite(name="custom")
custom.register(Brochure, CustomBrochureAdmin)
open_site = OpenSite(name="open")
open_site.register(Brochure, BrochureAdmin)

urlpatterns = [
    path("leased/", leased.urls),
    path("custom/", custom.urls),
    path("open/", open_site.urls),
]
