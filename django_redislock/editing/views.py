"""The edit lease's requests: opening the form, the fenced save, and the page's endpoints.

Every request after the first one that touches the lease adopts the page's
ticket (``lease.adopted``): a renewal extends it and hands back the next
ticket, the release on leaving lets it go, the save writes only while it
holds it with the fencing token the form was given. A save and a take-over
of one object run under its save lock (``lease.saving``), one after the
other: a take-over never clears a lease while its holder's save is being
written, and a save that comes after a take-over finds its ticket dead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timezone
from http import HTTPStatus
from typing import Any

from django.contrib import messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.utils.formats import date_format
from django.utils.timezone import localtime
from django.utils.translation import gettext as _

from django_redislock.backend import client as backend
from django_redislock.editing import lease
from django_redislock.editing.state import (
    FENCE_FIELD,
    TICKET_FIELD,
    LeaseState,
    Status,
    set_state,
)
from django_redislock.exceptions import LockBackendError, LockLostError, LockTimeout

logger = logging.getLogger(__name__)
#: Session key prefix of a lease handed to the next page (take-over, save and continue).
HANDED = "redislock_edit_lease:"
#: Django's "Save and continue editing" button.
CONTINUE = "_continue"

View = Callable[..., HttpResponse]
Proceed = Callable[[], HttpResponse]


def _change_url(model_admin: Any, obj: Any) -> str:
    opts = model_admin.opts
    return reverse(
        f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_change",
        args=(quote(obj.pk),),
    )


def _since(editor: lease.Editor) -> str:
    moment = localtime(datetime.fromtimestamp(editor.since, tz=timezone.utc))
    return date_format(moment, "H:i")


def _mine(editor: lease.Editor | None, request: HttpRequest) -> bool:
    return editor is not None and editor.user_id == str(request.user.pk)


# opening the form ---------------------------------------------------------------------


def _handed(model_admin: Any, request: HttpRequest, name: str) -> lease.Grant | None:
    """A lease a take-over or a "save and continue" handed to this page, renewed
    (so it is known held), or ``None``."""
    handed = request.session.pop(HANDED + name, None)
    if not isinstance(handed, dict):
        return None
    found = lease.holder(name, using=model_admin.edit_lease_using)
    editor = found[1] if found else None
    if not _mine(editor, request):
        return None
    assert editor is not None
    try:
        return lease.renew(str(handed.get("ticket")), editor, lease=model_admin.edit_lease_timeout)
    except LockLostError:
        return None


def _hand(request: HttpRequest, name: str, grant: lease.Grant) -> None:
    request.session[HANDED + name] = {"ticket": grant.ticket, "fence": grant.fencing_token}


def open_lease(model_admin: Any, request: HttpRequest, obj: Any) -> LeaseState:
    """Take ``obj``'s lease for the user opening its change form, or find who has it."""
    name = model_admin.edit_lease_name(obj)
    using, timeout = model_admin.edit_lease_using, model_admin.edit_lease_timeout
    state = LeaseState(str(obj.pk), "unavailable")
    try:
        grant = _handed(model_admin, request, name)
        for _attempt in range(2):  # free again between the take and the read: once more
            grant = grant or lease.take(
                name, lease.editor_of(request.user), lease=timeout, using=using
            )
            found = None if grant else lease.holder(name, using=using)
            if grant or found:
                break
        if grant is not None:
            state = LeaseState(str(obj.pk), "held", grant=grant)
        elif found is not None:
            editor = found[1]
            status: Status = "elsewhere" if _mine(editor, request) else "busy"
            state = LeaseState(str(obj.pk), status, editor=editor)
    except backend.backend_errors_and(LockBackendError, LockTimeout, LockLostError) as exc:
        logger.warning("Edit lease %r unavailable: %r", name, exc)
    set_state(request, state)
    return state


def page_context(
    model_admin: Any, request: HttpRequest, obj: Any, state: LeaseState
) -> dict[str, Any]:
    """What the change form's banner and script need (``state`` is read when the
    template renders: a refused save's page shows the lease it holds then)."""
    opts = model_admin.opts
    names = f"{model_admin.admin_site.name}:{opts.app_label}_{opts.model_name}_edit_lease_"
    urls = {
        action: reverse(names + action, args=(quote(obj.pk),))
        for action in ("renew", "release", "status", "take_over")
    }
    editor = state.editor
    can_take_over = state.status == "elsewhere" or (
        state.status == "busy" and model_admin.has_edit_lease_take_over_permission(request, obj)
    )
    return {
        "state": state,
        "editor": editor,
        "since": _since(editor) if editor else None,
        "can_take_over": can_take_over,
        "ticket_field": TICKET_FIELD,
        "fence_field": FENCE_FIELD,
        "take_over_url": urls["take_over"],
        "verbose_name": opts.verbose_name,
        "config": {
            "status": state.status,
            "name": model_admin.edit_lease_name(obj),
            "renewUrl": urls["renew"],
            "releaseUrl": urls["release"],
            "statusUrl": urls["status"],
            "renewMs": int(model_admin.edit_lease_timeout * 1000 / 3),
            "ticketField": TICKET_FIELD,
            "resuming": _("Reloading: this tab's edit lease is on its way back…"),
        },
    }


# the save -----------------------------------------------------------------------------


def lost_message(model_admin: Any, request: HttpRequest, obj: Any) -> str:
    """Why this page's lease is gone, as its editor is told."""
    found = lease.holder(model_admin.edit_lease_name(obj), using=model_admin.edit_lease_using)
    editor = found[1] if found else None
    labels = {"obj": str(obj)}
    if editor is not None and _mine(editor, request):
        # a take-over in another tab, or this page's own renewal whose answer
        # (its next ticket) was lost on the way: the server cannot tell them apart
        return (
            _(
                "This page no longer holds the edit lease on “%(obj)s”: you hold it in another "
                "tab or window (or this page missed the answer to its last renewal)."
            )
            % labels
        )
    if editor is not None:
        labels.update(user=editor.username, since=_since(editor))
        return _("%(user)s took over editing “%(obj)s” at %(since)s.") % labels
    return (
        _("Your edit lease on “%(obj)s” ran out (the page was closed, asleep or offline too long).")
        % labels
    )


def _refuse(request: HttpRequest, why: str) -> HttpResponse:
    messages.error(request, why + " " + _("Your changes were not saved."))
    return HttpResponseRedirect(request.get_full_path())


def fenced_save(model_admin: Any, request: HttpRequest, obj: Any, proceed: Proceed) -> HttpResponse:
    """Save only while the page's lease is adopted with the fencing token it was
    given, under the object's save lock; else refuse with why, changing nothing."""
    name = model_admin.edit_lease_name(obj)
    ticket, fence = request.POST.get(TICKET_FIELD, ""), request.POST.get(FENCE_FIELD, "")
    try:
        with lease.saving(name, using=model_admin.edit_lease_using):
            found = lease.holder(name, using=model_admin.edit_lease_using)
            editor = found[1] if found else None
            if editor is None or not _mine(editor, request):
                return _refuse(request, lost_message(model_admin, request, obj))
            with lease.adopted(ticket, editor) as lock:
                if str(lock.fencing_token) != fence:
                    raise LockLostError(f"{name}: the form's fencing token is not the lease's")
                state = LeaseState(str(obj.pk), "held")
                set_state(request, state)
                response = proceed()
                if not isinstance(response, HttpResponseRedirect):  # not saved: errors shown
                    state.grant = lease.Grant(lock.detach(), int(fence))
                elif CONTINUE in request.POST:
                    _hand(request, name, lease.Grant(lock.detach(), int(fence)))
                else:
                    lock.release()
                return response
    except LockLostError:
        return _refuse(request, lost_message(model_admin, request, obj))
    except LockTimeout:
        return _refuse(request, _("Another save or take-over of this object is under way."))
    except backend.backend_errors_and(LockBackendError):
        return _refuse(request, _("The edit lease could not be checked (Redis is unreachable)."))


def give_up_posted(model_admin: Any, request: HttpRequest, obj: Any) -> None:
    """Let the lease a leaving page posted go (best effort: it runs out anyway)."""
    ticket = request.POST.get(TICKET_FIELD, "")
    if not ticket:
        return
    name = model_admin.edit_lease_name(obj)
    try:
        found = lease.holder(name, using=model_admin.edit_lease_using)
        if found and found[1] and _mine(found[1], request):
            lease.give_up(ticket, found[1])
    except backend.backend_errors_and(LockBackendError, LockTimeout, LockLostError) as exc:
        # the leaving page is gone: nobody to tell; the lease runs out by itself
        logger.info("Could not give up the edit lease of %r: %s", name, exc)


# the page's endpoints -----------------------------------------------------------------


def _endpoint(
    model_admin: Any,
    handler: Callable[[Any, HttpRequest, Any], HttpResponse],
    methods: tuple[str, ...] = ("POST",),
) -> View:
    """A view of ``model_admin`` for one object: staff only, its methods only,
    404 for an object that is not there (or not the user's to see)."""

    def view(request: HttpRequest, object_id: str) -> HttpResponse:
        if request.method not in methods:
            return JsonResponse(
                {"error": "method not allowed"}, status=HTTPStatus.METHOD_NOT_ALLOWED
            )
        user = request.user
        if not (user.is_active and user.is_staff):
            return JsonResponse({"error": "staff only"}, status=HTTPStatus.FORBIDDEN)
        obj = model_admin.get_object(request, unquote(object_id))
        if obj is None or not model_admin.has_view_or_change_permission(request, obj):
            return JsonResponse({"error": "not found"}, status=HTTPStatus.NOT_FOUND)
        try:
            return handler(model_admin, request, obj)
        except backend.backend_errors_and(LockBackendError, LockTimeout):
            message = _("The edit lease could not be reached (Redis is unreachable).")
            return JsonResponse(
                {"status": "error", "message": message}, status=HTTPStatus.SERVICE_UNAVAILABLE
            )

    return view


def _renew(model_admin: Any, request: HttpRequest, obj: Any) -> HttpResponse:
    name = model_admin.edit_lease_name(obj)
    found = lease.holder(name, using=model_admin.edit_lease_using)
    editor = found[1] if found else None
    if editor is not None and _mine(editor, request):
        try:
            ticket = request.POST.get(TICKET_FIELD, "")
            grant = lease.renew(ticket, editor, lease=model_admin.edit_lease_timeout)
            return JsonResponse({"status": "held", "ticket": grant.ticket})
        except LockLostError:
            pass  # not swallowed: answered below, the page told why its lease is gone (409)
    message = lost_message(model_admin, request, obj) + " " + _("Your changes cannot be saved.")
    return JsonResponse({"status": "lost", "message": message}, status=HTTPStatus.CONFLICT)


def _release(model_admin: Any, request: HttpRequest, obj: Any) -> HttpResponse:
    give_up_posted(model_admin, request, obj)
    return JsonResponse({"status": "released"})


def _status(model_admin: Any, request: HttpRequest, obj: Any) -> HttpResponse:
    found = lease.holder(model_admin.edit_lease_name(obj), using=model_admin.edit_lease_using)
    editor = found[1] if found else None
    return JsonResponse({"free": found is None, "mine": _mine(editor, request)})


def renew(model_admin: Any) -> View:
    return _endpoint(model_admin, _renew)


def release(model_admin: Any) -> View:
    return _endpoint(model_admin, _release)


def status(model_admin: Any) -> View:
    return _endpoint(model_admin, _status, ("GET",))


def _clear_and_take(
    model_admin: Any, request: HttpRequest, obj: Any, shown: str | None
) -> tuple[lease.Editor | None, bool, lease.Grant | None]:
    """Under the save lock: the previous editor, whether another user, and the
    new lease (``None`` when the lease is held by someone the page did not show)."""
    name, using = model_admin.edit_lease_name(obj), model_admin.edit_lease_using
    with lease.saving(name, using=using):
        found = lease.holder(name, using=using)
        previous = found[1] if found else None
        theirs = previous is not None and not _mine(previous, request)
        if theirs and not model_admin.has_edit_lease_take_over_permission(request, obj):
            raise PermissionDenied
        if previous is not None and previous.user_id != shown:
            return previous, theirs, None  # not whom the page showed: left alone
        if not lease.clear(name, shown, using=using):
            return previous, theirs, None
        editor = lease.editor_of(request.user)
        return (
            previous,
            theirs,
            lease.take(name, editor, lease=model_admin.edit_lease_timeout, using=using),
        )


def _take_over(model_admin: Any, request: HttpRequest, obj: Any) -> HttpResponse:
    """Take ``obj``'s lease from the editor the page showed (``holder``: their
    user id), under the save lock so no save of theirs is half written; hand
    it to the change form this redirects to, and log it."""
    back = HttpResponseRedirect(_change_url(model_admin, obj))
    try:
        previous, theirs, grant = _clear_and_take(
            model_admin, request, obj, request.POST.get("holder") or None
        )
    except LockTimeout:
        messages.warning(request, _("Another save or take-over of this object is under way."))
        return back
    labels = {"obj": str(obj), "user": previous.username if previous else ""}
    if grant is None:
        messages.warning(
            request, _("Someone else is editing “%(obj)s” now; nothing was taken over.") % labels
        )
        return back
    _hand(request, model_admin.edit_lease_name(obj), grant)
    if theirs:
        assert previous is not None
        since = datetime.fromtimestamp(previous.since, tz=timezone.utc)
        model_admin.log_change(
            request,
            obj,
            f"Took over the edit lease from {previous.username} "
            f"(editing since {since.isoformat(timespec='seconds')}).",
        )
        messages.success(request, _("You took over editing “%(obj)s” from %(user)s.") % labels)
    return back


def take_over(model_admin: Any) -> View:
    return _endpoint(model_admin, _take_over)
