"""``EditLeaseMixin``: a ``ModelAdmin``'s change form held by one editor at a time.

Opening an object's change form takes its edit lease (``lease.take``) for
the user; the page renews it (``static/django_redislock/edit_lease.js``) and
gives it up on leaving. Anyone else opening it gets the form read only, with
who edits it and since when, and a take-over button when allowed. The save
runs with the page's lease adopted and its fencing token checked, under the
object's save lock (``views.fenced_save``), so a page whose lease was lost
or taken over cannot write, however late its request arrives.

Only the change form is touched: the change list, the add form, "save as
new" (which writes a new object, not the one leased) and the models of
other admins behave as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.loader import select_template
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.translation import gettext as _

from django_redislock.editing import lease, views
from django_redislock.editing.state import SAVE_AS_NEW, current_state
from django_redislock.validation import check_lease

if TYPE_CHECKING:
    _Base = admin.ModelAdmin[Any]
else:
    _Base = object

#: The permission that lets a user take an object's edit lease from another
#: user (beside change permission on the object). ``release_lock`` (the
#: dashboard's force-release) allows it too.
TAKE_OVER_PERMISSION = "django_redislock.take_over_edit_lease"
RELEASE_PERMISSION = "django_redislock.release_lock"
TEMPLATE = "admin/django_redislock/edit_lease/change_form.html"


class EditLeaseMixin(_Base):
    """Mix into a ``ModelAdmin`` (before it) to lease the change form to one editor.

    ``edit_lease_timeout``: seconds a lease lasts unless renewed; the page
    renews it every third of that, so a closed tab's lease (if its release
    never arrived) ends within it. ``edit_lease_using``: the cache alias
    (``REDISLOCK["CACHE"]`` when ``None``). Override
    ``has_edit_lease_take_over_permission`` to decide who may take over.
    """

    edit_lease_timeout: float = 120.0
    edit_lease_using: str | None = None

    def __init__(self, model: Any, admin_site: Any) -> None:
        if not isinstance(self, admin.ModelAdmin):
            raise ImproperlyConfigured(
                f"{type(self).__qualname__}: EditLeaseMixin goes on a ModelAdmin "
                "(class MyAdmin(EditLeaseMixin, admin.ModelAdmin)), not on an inline "
                "or another class."
            )
        if model._meta.pk is None or model._meta.abstract:
            raise ImproperlyConfigured(
                f"{type(self).__qualname__}: {model._meta.label} has no primary key "
                "to name its edit lease by."
            )
        try:
            check_lease(self.edit_lease_timeout, "edit_lease_timeout")
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{type(self).__qualname__}: {exc}") from exc
        if self.edit_lease_timeout is None or self.edit_lease_timeout < 3:
            raise ImproperlyConfigured(
                f"{type(self).__qualname__}: edit_lease_timeout must be at least 3 seconds "
                f"(the page renews every third of it), got {self.edit_lease_timeout!r}"
            )
        super().__init__(model, admin_site)

    # names and permissions ------------------------------------------------------------

    def edit_lease_name(self, obj: Any) -> str:
        return lease.lease_name(self.opts.label_lower, obj.pk)

    def has_edit_lease_take_over_permission(self, request: HttpRequest, obj: Any) -> bool:
        """Whether ``request.user`` may take ``obj``'s lease from another user:
        change permission on it, and ``take_over_edit_lease`` or ``release_lock``."""
        user = request.user
        return super().has_change_permission(request, obj) and (
            user.has_perm(TAKE_OVER_PERMISSION) or user.has_perm(RELEASE_PERMISSION)
        )

    def check_edit_lease_user(self, request: HttpRequest) -> None:
        """Leases are for staff: a custom admin site that lets others in gets a
        clear refusal, not a lease nobody can attribute."""
        user = request.user
        if not (user.is_active and user.is_staff):
            raise PermissionDenied(_("Edit leases are for active staff users only."))

    # the read-only form for everyone but the lease's holder ----------------------------

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        state = current_state(request)
        if obj is not None and state is not None and state.read_only and state.pk == str(obj.pk):
            return False
        return super().has_change_permission(request, obj)

    def get_inline_instances(self, request: HttpRequest, obj: Any = None) -> list[Any]:
        inlines = super().get_inline_instances(request, obj)
        state = current_state(request)
        if obj is not None and state is not None and state.read_only and state.pk == str(obj.pk):
            for inline in inlines:  # built for this request: read only on this page only
                for method in (
                    "has_add_permission",
                    "has_change_permission",
                    "has_delete_permission",
                ):
                    setattr(inline, method, _not_allowed)
        return inlines

    # views -------------------------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        info = self.opts.app_label, self.opts.model_name
        urls = [
            path(
                f"<path:object_id>/edit-lease/{action}/",
                wrap(getattr(views, action.replace("-", "_"))(self)),
                name="{}_{}_edit_lease_".format(*info) + action.replace("-", "_"),
            )
            for action in ("renew", "release", "status", "take-over")
        ]
        return urls + super().get_urls()

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        if object_id is None:
            return super().changeform_view(request, object_id, form_url, extra_context)
        self.check_edit_lease_user(request)

        def proceed() -> HttpResponse:
            return super(EditLeaseMixin, self).changeform_view(
                request, object_id, form_url, extra_context
            )

        if request.method not in ("GET", "POST"):
            return proceed()
        obj = self.get_object(request, unquote(object_id))
        if obj is None or not super().has_change_permission(request, obj):
            return proceed()  # Django's answer: not found, or the form read only
        if request.method == "GET":
            views.open_lease(self, request, obj)
            return proceed()
        if SAVE_AS_NEW in request.POST:  # writes a new object; this page is leaving
            response = proceed()
            views.give_up_posted(self, request, obj)
            return response
        return views.fenced_save(self, request, obj, proceed)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Any = None,
    ) -> HttpResponse:
        response = super().render_change_form(request, context, add, change, form_url, obj)
        state = current_state(request)
        if add or obj is None or state is None or not isinstance(response, TemplateResponse):
            return response
        assert response.context_data is not None
        parent: Any = response.template_name  # what the admin would render: names, or a template
        if isinstance(parent, str | list | tuple):
            parent = select_template([parent] if isinstance(parent, str) else list(parent))
        response.context_data["edit_lease_parent"] = getattr(parent, "template", parent)
        response.context_data["edit_lease"] = views.page_context(self, request, obj, state)
        response.template_name = TEMPLATE
        return response


def _not_allowed(request: HttpRequest, obj: Any = None) -> bool:
    return False


__all__ = ["TAKE_OVER_PERMISSION", "EditLeaseMixin"]
