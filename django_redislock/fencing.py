"""Fenced writes: the database refuses a write made with an outdated fencing token.

A lock cannot stop a holder that was paused past its lease (GC, SIGSTOP, a VM
migration) from writing when it resumes: by then another holder has the lock
and a newer fencing token. The defence is at the resource. A row remembers the
highest token that wrote it, and a write is one conditional ``UPDATE``::

    UPDATE ... SET ..., fence = <token> WHERE <your filter> AND fence < <token>

Timeline of the case it covers::

    A: acquire -> token 7       A: paused ...............  A: resumes, writes with 7
    (lease runs out)            B: acquire -> token 8
                                B: writes with 8 (fence=8) A's write: 8 < 7 is false,
                                                           refused, nothing changed

What it does not cover on its own is a read-modify-write: the newer holder
may read before the stale holder's write lands, and its own write, made from
that read, is accepted after it (one update lost). ``fenced_update``'s
``expected`` guard (the fence as read) refuses such a write.

The check and the write are one statement, so they are atomic on every
database Django supports; no transaction or row lock is needed for it (but
for a multi-table child, whose parent's table is written apart: see
``fenced_update``).

Importing this module imports ``django.db.models`` but defines no model, so it
works before the app registry is ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from django.core.exceptions import FieldDoesNotExist
from django.db import models, router, transaction
from django.db.models import sql

__all__ = ["FenceField", "fenced_update"]


class FenceField(models.BigIntegerField):  # type: ignore[type-arg]
    """The highest fencing token that wrote this row (0 for never).

    A ``BigIntegerField``: fencing tokens start from the Redis server's clock in
    microseconds (about 2**51 today), beyond a 32-bit integer.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 0)
        kwargs.setdefault("editable", False)
        super().__init__(*args, **kwargs)

    def deconstruct(self) -> Any:
        name, path, args, kwargs = super().deconstruct()
        if kwargs.get("default") == 0:
            del kwargs["default"]
        if kwargs.get("editable") is False:
            del kwargs["editable"]
        return name, path, args, kwargs


def check_token(token: object) -> int:
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(
            f"token must be an int fencing token (lock.fencing_token), not {type(token).__name__}."
        )
    if not 0 < token < 2**63:  # what a BigIntegerField holds; the tokens are below 2**53
        raise ValueError(f"token must be a positive fencing token below 2**63, got {token!r}.")
    return token


def fenced_update(
    target: models.Model | models.QuerySet[Any],
    token: int,
    *,
    field: str = "fence",
    expected: Mapping[str, Any] | None = None,
    **values: Any,
) -> bool:
    """Write ``values`` only where the row's ``field`` is below ``token``; whether it did.

    The fence orders *writes*: a holder's write never lands after a newer
    holder's. It does not protect a read-modify-write on its own: a stale
    holder's write can land after a newer holder read the row and before it
    wrote, and both writes are accepted (one increment lost). ``expected``
    closes that gap: field names (or ``name__lookup`` filters of the fence's
    table) and the values the row must still hold, checked in the same
    ``UPDATE``. Pass the fence as it was read, ``expected={"fence":
    doc.fence}``: every accepted write moves the fence up, so the write is
    refused if anyone wrote since the read (then read again and retry, or
    give up). Timeline::

        A: acquire -> 7, (lease runs out)    B: acquire -> 8, reads (n=10, fence=6)
        A: writes n=11 with 7 (6 < 7: ok)    B: writes n=11 with 8 (7 < 8: ok): lost
        with expected={"fence": 6}:          B's write is refused (fence is 7):
                                             B reads n=11, writes n=12

    ``target`` is a saved model instance (its row, by primary key, in the
    database and through the manager its ``save()`` would write with) or a
    queryset, whose own filter and database are kept: pass
    ``Item.objects.filter(pk=pk, stock__gte=n)`` to guard a stock deduction
    by both the fence and the stock. ``values`` are what ``QuerySet.update``
    takes (``F()`` expressions included), and ``field`` is set to ``token`` in
    the same statement.

    On a multi-table child whose fence (or another written field) is a
    parent's, an instance's fence row is written first, with the check, and
    its other tables after it in one transaction; a queryset that Django
    would write that way (a join in its filter, fields of two tables) is a
    ``ValueError`` (``_write_queryset`` says why).

    Returns ``True`` when at least one row was written. ``False`` means a
    holder with a newer (or the same) token has written since, or that no row
    matched: either way nothing changed, and the caller must not carry on as
    if it had. On a model instance the written values are not reloaded
    (``F()`` expressions are not evaluated); ``field`` is updated in memory.
    """
    token = check_token(token)
    if not isinstance(field, str) or not field:
        raise TypeError(f"field must be the name of the fence field, not {field!r}.")
    guards = check_expected(expected)
    if isinstance(target, models.Model):
        return _update_instance(target, token, field, values, guards)
    if not isinstance(target, models.QuerySet):
        raise TypeError(
            f"target must be a model instance or a QuerySet, not {type(target).__name__}."
        )
    return _write_queryset(target, token, field, values, guards)


def _update_instance(
    target: models.Model,
    token: int,
    field: str,
    values: dict[str, Any],
    guards: dict[str, Any],
) -> bool:
    """``fenced_update`` of a saved instance: its row written as its ``save()``
    would write it (``_write_instance``), then ``field`` set in memory, the
    only value that is known without reading the row again."""
    if target.pk is None:
        raise ValueError("target must be a saved model instance (its pk is None).")
    if not _write_instance(target, token, field, values, guards):
        return False
    setattr(target, field, token)
    return True


def _write_queryset(
    target: models.QuerySet[Any],
    token: int,
    field: str,
    values: dict[str, Any],
    guards: dict[str, Any],
) -> bool:
    """``fenced_update`` of a queryset: one ``UPDATE`` carrying every guard.

    The fence check must be in the ``UPDATE`` of the fence's own table: on a
    multi-table child whose fence (or another written field) is a parent's,
    Django's update selects the ids first and then updates by id, and a
    newer holder committing in between would be overwritten. An instance is
    written in two statements for that reason (``_write_instance``); a
    queryset's filter is the caller's, so one that Django would split is
    refused rather than split here."""
    guarded = target.filter(**{f"{field}__lt": token}, **guards)
    writes = {**values, field: token}
    if _spans_tables(guarded, writes):
        raise ValueError(
            f"fenced_update cannot guard this {target.model.__name__} queryset: its filter "
            f"joins another table or it writes fields of two tables, so the fence check "
            f"would not be in the UPDATE itself. Pass the instance, or a queryset of the "
            f"model that holds {field!r} filtered on its own columns."
        )
    return bool(guarded.update(**writes))


def check_expected(expected: object) -> dict[str, Any]:
    """``expected`` as filters: ``None`` for none, else a mapping of names to values."""
    if expected is None:
        return {}
    if not isinstance(expected, Mapping):
        raise TypeError(
            f"expected must be a mapping of field names to the values read "
            f"(expected={{'fence': row.fence}}), not {type(expected).__name__}."
        )
    for name in expected:
        if not isinstance(name, str) or not name:
            raise TypeError(f"expected's keys must be field names, not {name!r}.")
    return dict(expected)


def _spans_tables(queryset: models.QuerySet[Any], writes: dict[str, Any]) -> bool:
    """Whether Django would run this update as a ``SELECT`` of ids (or a
    subquery) plus an ``UPDATE`` by id, as ``SQLUpdateCompiler`` decides."""
    query = cast(sql.UpdateQuery, queryset.query.chain(sql.UpdateQuery))
    query.add_update_values(writes)
    query.get_initial_alias()
    return bool(query.get_related_updates()) or query.count_active_tables() > 1


def _write_instance(
    target: models.Model,
    token: int,
    field: str,
    values: dict[str, Any],
    guards: dict[str, Any],
) -> bool:
    """The fenced write of one saved instance, as its ``save()`` would write it:
    in the routers' database, else the one it came from (never a read replica
    it was read from), through the base manager (a default manager may hide
    the row). The fence's table is written first, by itself, with the check
    (and the ``expected`` guards, which must name its own columns);
    the instance's other tables (a multi-table child's) after it, in the same
    transaction, which holds the fence row's lock until they are written."""
    model = type(target)
    meta = model._meta
    using = router.db_for_write(model, instance=target)
    owner = meta.get_field(field).model._meta.concrete_model
    assert owner is not None
    _check_guards_in(owner, meta, guards, field)
    fenced: dict[str, Any] = {field: token}
    rest: dict[str, Any] = {}
    for name, value in values.items():
        table = meta.get_field(name).model._meta.concrete_model
        (fenced if table is owner else rest)[name] = value
    pk_field = owner._meta.pk
    assert pk_field is not None
    fence_row = owner._base_manager.db_manager(using).filter(
        pk=getattr(target, pk_field.attname), **{f"{field}__lt": token}, **guards
    )
    row = model._base_manager.db_manager(using).filter(pk=target.pk)
    if owner is meta.concrete_model and not rest:
        return bool(fence_row.update(**fenced))  # one statement, no transaction
    with transaction.atomic(using=using):
        if not row.exists() or not fence_row.update(**fenced):
            return False
        if rest:
            row.update(**rest)
    return True


def _check_guards_in(owner: Any, meta: Any, guards: dict[str, Any], field: str) -> None:
    """Each ``expected`` guard must be a column of the fence's own table (a
    plain field, then lookups only): it is checked in that table's
    ``UPDATE``, with the fence."""
    for name in guards:
        base, _, rest = name.partition("__")
        try:
            found = meta.get_field(base)
        except FieldDoesNotExist:
            raise ValueError(
                f"expected names {name!r}, but {meta.model.__name__} has no field {base!r}."
            ) from None
        if found.model._meta.concrete_model is not owner or (found.is_relation and rest):
            raise ValueError(
                f"expected can only guard columns of the table that holds {field!r} "
                f"({owner.__name__}), not {name!r}; guard on the fence you read "
                f"(expected={{{field!r}: row.{field}}}) instead."
            )
