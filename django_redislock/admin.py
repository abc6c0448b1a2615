"""The admin dashboard of held locks, semaphores and read-write locks.

One page under the ``HeldLock`` entry of the admin index, a staff-only JSON
endpoint it refreshes from, and a force-release confirmation step. Built with
``ModelAdmin.get_urls`` and ``admin_site.admin_view`` (login, staff and CSRF
handling come from the admin); nothing is loaded from the network. Also
where ``EditLeaseMixin`` (``editing/``) is imported from.
"""

from __future__ import annotations

from datetime import datetime, timezone
from http import HTTPStatus
from typing import Any
from urllib.parse import urlencode

import django
from django.contrib import admin, messages
from django.contrib.admin.models import DELETION, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy
from django.views.decorators.http import require_GET, require_http_methods

from django_redislock.backend import client as backend
from django_redislock.conf import get_settings
from django_redislock.editing.mixin import EditLeaseMixin
from django_redislock.models import HeldLock
from django_redislock.ops import audit, charts, dashboard, inspection
from django_redislock.ops.common import OpsError, Page, check_name_arg, connect, describe_error

__all__ = ["EditLeaseMixin", "HeldLockAdmin"]
#: Rows per dashboard page.
PER_PAGE = 100
#: How often the page refreshes from the server, in milliseconds.
REFRESH_MS = 3000
RELEASE_PERMISSION = "django_redislock.release_lock"
#: Force-releases are logged here (INFO), beside the admin's ``LogEntry``.
ORDER_LABELS = {
    "waits": gettext_lazy("waits"),
    "timeouts": gettext_lazy("timeouts"),
    "lost": gettext_lazy("lost leases"),
    "wait_ms": gettext_lazy("wait time"),
}


def _page_number(request: HttpRequest) -> int:
    try:
        return max(1, int(request.GET.get("page", "1")))
    except ValueError:
        return 1


@admin.register(HeldLock)
class HeldLockAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    # Every staff member may look; only ``release_lock`` may act.
    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self.has_module_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        info = self.opts.app_label, self.opts.model_name
        return [
            path("", view(self.dashboard_view), name="{}_{}_changelist".format(*info)),
            path("data/", view(self.data_view), name="{}_{}_data".format(*info)),
            path("hot/", view(self.hot_view), name="{}_{}_hot".format(*info)),
            path("release/", view(self.release_view), name="{}_{}_release".format(*info)),
            # any name: the path converter takes "/" too, and reverse() quotes the rest
            path("name/<path:name>/", view(self.detail_view), name="{}_{}_detail".format(*info)),
        ]

    # views ----------------------------------------------------------------------

    def _page(self, request: HttpRequest) -> tuple[Page, float, list[dict[str, Any]]]:
        """The page of rows asked for, and the server time they are as of."""
        client, prefix = connect()
        now = dashboard.server_time(client)
        page = Page(
            client,
            prefix,
            query=request.GET.get("q", "").strip(),
            number=_page_number(request),
            per_page=PER_PAGE,
            counters=get_settings().stats,
        )
        rows = dashboard.rows(page, client, prefix, now=now)
        for row in rows:
            row["release_url"] = self._release_url(row["name"], row["kind"])
            row["detail_url"] = self._detail_url(row["name"])
        return page, now, rows

    @staticmethod
    def _error(exc: BaseException) -> str:
        return str(exc) if isinstance(exc, OpsError) else describe_error(exc)

    def _check_view(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied

    def _base_context(self, request: HttpRequest) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "breadcrumbs_as_list": django.VERSION >= (6, 1),
        }

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """The page; with Redis unreachable, the error and nothing else."""
        self._check_view(request)
        query = request.GET.get("q", "").strip()
        context = {
            **self._base_context(request),
            "title": _("Held locks"),
            "query": query,
            "error": None,
            "can_release": request.user.has_perm(RELEASE_PERMISSION),
            "data_url": self._url("data"),
            "hot_url": self._url("hot"),
            "refresh_ms": REFRESH_MS,
            # a wide table: the page takes the width the app list would
            "is_nav_sidebar_enabled": False,
        }
        try:
            page, now, rows = self._page(request)
            context.update(self._hot_context(request))
        except backend.backend_errors_and(OpsError) as exc:
            context["error"] = self._error(exc)
            return TemplateResponse(request, "admin/django_redislock/dashboard.html", context)
        context.update(
            page=page,
            rows=rows,
            server_time=now,
            counters_enabled=get_settings().stats,
            previous_url=self._page_url(query, page.number - 1) if page.number > 1 else None,
            next_url=self._page_url(query, page.number + 1) if page.number < page.pages else None,
        )
        return TemplateResponse(request, "admin/django_redislock/dashboard.html", context)

    def _hot_context(self, request: HttpRequest) -> dict[str, Any]:
        """The hot-names panel: window and order from the query string."""
        window = dashboard.choice(request.GET.get("window"), dashboard.WINDOWS, 15)
        order = dashboard.choice(request.GET.get("order"), dashboard.ORDERS, "waits")
        client, prefix = connect()
        hot = [
            charts.name_charts(entry)
            for entry in dashboard.hot_panel(client, prefix, window=window, order=order)
        ]
        return {
            "hot": hot,
            "window": window,
            "order": order,
            "windows": dashboard.WINDOWS,
            "orders": list(ORDER_LABELS.items()),
        }

    def hot_view(self, request: HttpRequest) -> HttpResponse:
        """The hot-names panel alone, for the page's periodic refresh."""
        self._check_view(request)
        return require_GET(self._hot)(request)

    def _hot(self, request: HttpRequest) -> HttpResponse:
        try:
            context = self._hot_context(request)
        except backend.backend_errors_and(OpsError) as exc:
            context = {"hot_error": self._error(exc)}
        return TemplateResponse(request, "admin/django_redislock/hot.html", context)

    @staticmethod
    def _page_url(query: str, number: int) -> str:
        params = {"page": str(number)}
        if query:
            params["q"] = query
        return "?" + urlencode(params)

    def _url(self, view: str) -> str:
        """A URL of this dashboard on whichever admin site it is registered with."""
        return reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_{view}"
        )

    def _detail_url(self, name: str) -> str:
        return reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_detail",
            kwargs={"name": name},
        )

    def _release_url(self, name: str, kind: str) -> str:
        return self._url("release") + "?" + urlencode({"name": name, "kind": kind})

    def data_view(self, request: HttpRequest) -> HttpResponse:
        self._check_view(request)
        return require_GET(self._data)(request)

    def _data(self, request: HttpRequest) -> HttpResponse:
        try:
            page, now, rows = self._page(request)
        except backend.backend_errors_and(OpsError) as exc:
            return JsonResponse({"error": self._error(exc)}, status=503)
        return JsonResponse(
            {
                # the Redis server's clock when the rows were read: every
                # ttl and held_for is as of this instant
                "server_time": now,
                "count": page.count,
                "page": page.number,
                "pages": page.pages,
                "per_page": page.per_page,
                "can_release": request.user.has_perm(RELEASE_PERMISSION),
                "results": rows,
            }
        )

    def detail_view(self, request: HttpRequest, name: str) -> HttpResponse:
        """One name's own page, the twin of ``manage.py locks inspect``: 404
        (with the page's own message) when nothing holds it."""
        self._check_view(request)
        return require_GET(self._detail)(request, name)

    def _detail(self, request: HttpRequest, name: str) -> HttpResponse:
        context: dict[str, Any] = {
            **self._base_context(request),
            "title": name,
            "name": name,
            "changelist_url": self._url("changelist"),
            "can_release": request.user.has_perm(RELEASE_PERMISSION),
            "counters_enabled": get_settings().stats,
            "is_nav_sidebar_enabled": False,
            "error": None,
        }
        status = HTTPStatus.OK
        try:
            name = check_name_arg(name)
            client, prefix = connect()
            now = dashboard.server_time(client)
            held = dashboard.detail(client, prefix, name, now=now)
            counters = inspection.stats(client, prefix, [name])[0] if held else {}
            history = dashboard.name_history(client, prefix, name, now=now) if held else None
        except OpsError as exc:
            context["error"] = str(exc)
            status = HTTPStatus.NOT_FOUND
        except backend.BACKEND_ERRORS as exc:
            context["error"] = self._error(exc)
            status = HTTPStatus.SERVICE_UNAVAILABLE
        else:
            for entry in held:
                entry["release_url"] = self._release_url(name, entry["kind"])
            context.update(
                held=held,
                counters=counters,
                counted=any(entry["counted"] for entry in held),
                read_at=datetime.fromtimestamp(now, tz=timezone.utc),
                history=charts.name_charts(history) if history is not None else None,
                server_time=now,
            )
            if not held:
                status = HTTPStatus.NOT_FOUND
        return TemplateResponse(
            request, "admin/django_redislock/detail.html", context, status=status
        )

    def release_view(self, request: HttpRequest) -> HttpResponse:
        self._check_view(request)
        return require_http_methods(["GET", "POST"])(self._release)(request)

    def _release(self, request: HttpRequest) -> HttpResponse:
        if not request.user.has_perm(RELEASE_PERMISSION):
            raise PermissionDenied
        source = request.POST if request.method == "POST" else request.GET
        changelist = self._url("changelist")
        try:
            name = check_name_arg(source.get("name", ""))
            kind = inspection.kinds([source.get("kind", "")])[0]
        except (OpsError, ValueError) as exc:
            messages.error(request, str(exc))
            return HttpResponseRedirect(changelist)
        # the holders the operator confirmed (the form carries digests of
        # their tokens): if the name changed hands since, the page is shown again
        confirmed = source.get("holders") if request.method == "POST" else None
        # "release whoever holds it now": for a busy name, which changes hands
        # faster than anyone can confirm its holders
        whoever = request.method == "POST" and source.get("whoever") == "1"
        if whoever:
            confirmed = None
        released = None
        try:
            client, prefix = connect()
            # before the clear: a failure after it would report an error for
            # a release that was made, and leave it out of the admin's log
            now = dashboard.server_time(client)
            info = kind.describe(client, prefix, name)
            if info is not None and request.method == "POST":
                released, info = self._clear(client, prefix, kind, info, confirmed)
        except backend.backend_errors_and(OpsError) as exc:
            messages.error(request, self._error(exc))
            return HttpResponseRedirect(changelist)
        labels = {"kind": kind.kind, "name": name}
        if info is None:
            messages.warning(request, _("%(kind)s “%(name)s” is not held any more.") % labels)
            return HttpResponseRedirect(changelist)
        if released == inspection.CHANGED_HANDS:
            messages.warning(
                request,
                _("%(kind)s “%(name)s” changed hands since you confirmed; nothing was released.")
                % labels,
            )
        elif released is not None:
            self._log(request, info, released, whoever=whoever)
            messages.success(
                request,
                _("Released %(kind)s “%(name)s”; its holders will get LockLostError.") % labels,
            )
            return HttpResponseRedirect(changelist)
        context = {
            **self._base_context(request),
            "title": _("Force-release %(kind)s") % {"kind": kind.kind},
            "info": info,
            "holders": dashboard.holders(info, now),
            "holders_signature": inspection.holders_signature(info),
            "changed_hands": released == inspection.CHANGED_HANDS,
            "is_nav_sidebar_enabled": False,
            "changelist_url": changelist,
        }
        return TemplateResponse(request, "admin/django_redislock/confirm_release.html", context)

    @staticmethod
    def _clear(
        client: Any,
        prefix: str,
        kind: inspection.Kind,
        info: inspection.HeldInfo,
        confirmed: str | None,
    ) -> tuple[int, inspection.HeldInfo | None]:
        """Clear ``info``'s name if the operator confirmed its holders: what
        the clear answered, and the name as it is now. The holders just read
        are the confirmed ones (their signature says so) and the script
        clears only if they still hold it, so a name that changes hands
        between that read and the clear is left to its new holder; it is read
        again for the page to show. A POST without ``holders`` confirmed
        nobody and clears whoever holds the name."""
        if confirmed is None:
            return kind.clear(client, prefix, info.name), info
        if confirmed != inspection.holders_signature(info):
            return inspection.CHANGED_HANDS, info
        released = kind.clear(client, prefix, info.name, confirmed=info)
        if released == inspection.CHANGED_HANDS:
            return released, kind.describe(client, prefix, info.name)
        return released, info if released else None  # none: nobody held it by then

    def _log(
        self, request: HttpRequest, info: inspection.HeldInfo, released: int, *, whoever: bool
    ) -> None:
        """Record a force-release in the admin log and the audit logger. For
        ``whoever`` (no holders confirmed), the holders named are the last
        ones read before the clear: under load, the one released may be a
        later holder."""
        holders = ", ".join(h.holder for h in info.holders)
        seen = "whoever held it; last read: " if whoever else ""
        message = (
            f"Force-released {info.kind} (fencing token {info.fencing_token or 'none taken'}, "
            f"holders: {seen}{holders}, released {released})"
        )
        audit.log_force_release(
            info.name,
            kind=info.kind,
            who=request.user.get_username(),
            where=f"admin, {request.META.get('REMOTE_ADDR') or 'unknown address'}",
            holders=[h.holder for h in info.holders],
        )
        obj = HeldLock(name=info.name)
        user_id = request.user.pk
        log_actions = getattr(LogEntry.objects, "log_actions", None)
        if log_actions is not None:  # Django >= 5.1
            log_actions(user_id, [obj], DELETION, change_message=message)
        else:  # pragma: no cover - Django < 5.1
            from django.contrib.contenttypes.models import ContentType

            log_action = getattr(LogEntry.objects, "log_action")  # noqa: B009
            log_action(
                user_id,
                ContentType.objects.get_for_model(obj, for_concrete_model=False).pk,
                obj.pk,
                str(obj)[:200],
                DELETION,
                message,
            )
