"""What one request knows about the edit lease of the object it shows.

The mixin's hooks (``has_change_permission``, ``get_inline_instances``,
``render_change_form``) are called by Django with the request and the
object only, so the lease found at the start of the request travels on the
request, for that object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from django.http import HttpRequest

from django_redislock.editing.lease import Editor, Grant

#: ``request`` attribute holding the ``LeaseState``.
ATTRIBUTE = "_redislock_edit_lease"
#: Form fields the page sends back: the lease's ticket and its fencing token.
TICKET_FIELD = "_redislock_edit_ticket"
FENCE_FIELD = "_redislock_edit_fence"
#: The change form's "Save as new" button.
SAVE_AS_NEW = "_saveasnew"

#: ``held``: this page holds the lease; ``busy``: another user does;
#: ``elsewhere``: the same user does, in another tab or window;
#: ``lost``: this page's save was refused (its lease gone); ``unavailable``:
#: Redis could not be reached, so nobody edits.
Status = Literal["held", "busy", "elsewhere", "unavailable"]


@dataclass
class LeaseState:
    pk: str
    status: Status
    grant: Grant | None = None
    editor: Editor | None = None  # the holder, for busy and elsewhere

    @property
    def read_only(self) -> bool:
        return self.status != "held"


def current_state(request: HttpRequest) -> LeaseState | None:
    state: Any = getattr(request, ATTRIBUTE, None)
    return state if isinstance(state, LeaseState) else None


def set_state(request: HttpRequest, state: LeaseState) -> None:
    setattr(request, ATTRIBUTE, state)
