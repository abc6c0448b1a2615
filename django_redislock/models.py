"""``InventoryMixin``: stock that cannot be oversold, even by a lock lost mid-way.

Import it from here (``django_redislock.models``); the package's ``__init__``
imports no models.

Two layers, each enough on its own against the classic lost update::

    worker A: SELECT stock -> 1          worker B: SELECT stock -> 1
    worker A: UPDATE stock = 0           worker B: UPDATE stock = 0   (two sold, one in stock)

1. The item's lock serialises deductions across processes, so contending
   buyers queue in Redis (fair, woken by the release) instead of piling up
   on the row in the database.
2. The write is ``UPDATE ... SET stock = stock - q WHERE pk = ... AND stock >= q``:
   the database refuses an oversell even if the lock was lost (lease expired
   in a pause, an operator cleared it, Redis failed over).

The lock is held until the database transaction that changed the stock has
ended, committed or rolled back, outermost block included: releasing it at the
end of ``deduct()`` inside an outer ``atomic()`` would let the next buyer read
a stock figure that is not committed yet.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, ClassVar

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import DEFAULT_DB_ALIAS, models, router, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import F
from django.utils.translation import gettext_lazy as _

from django_redislock import transactions
from django_redislock.exceptions import InsufficientStock

__all__ = ["HeldLock", "InsufficientStock", "InventoryMixin"]

logger = logging.getLogger(__name__)


#: No database's integer column holds more (a signed 64-bit integer).
MAX_QUANTITY = 2**63 - 1


def check_quantity(quantity: object, argument: str = "quantity") -> int:
    if isinstance(quantity, bool) or not isinstance(quantity, int):
        raise ValueError(
            f"{argument} must be a positive int, not {type(quantity).__name__} {quantity!r}."
        )
    if quantity < 1:
        raise ValueError(f"{argument} must be a positive int, got {quantity!r}.")
    return quantity


def _update_returning_sql(
    model: type[InventoryMixin], connection: BaseDatabaseWrapper
) -> str | None:
    """The guarded UPDATE with ``RETURNING`` where the database has it, else ``None``."""
    if connection.vendor == "postgresql":
        pass
    elif connection.vendor == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < (3, 35):
            return None
    else:
        return None
    owner = _stock_owner(model)
    quote = connection.ops.quote_name
    table = quote(owner._meta.db_table)
    stock_field = owner._meta.get_field(model.stock_field)
    pk_field = owner._meta.pk
    assert isinstance(stock_field, models.Field)
    assert pk_field is not None
    column, pk = quote(str(stock_field.column)), quote(str(pk_field.column))
    return (
        f"UPDATE {table} SET {column} = {column} - %s "
        f"WHERE {pk} = %s AND {column} >= %s RETURNING {column}"
    )


def _stock_owner(model: type[models.Model]) -> type[models.Model]:
    """The concrete model whose table holds the stock column: the model itself,
    or for a multi-table-inheritance child or a proxy, the parent that
    declares the field. Its row is the one every class of the item shares."""
    stock_field = model._meta.get_field(model.stock_field)  # type: ignore[attr-defined]
    owner = stock_field.model._meta.concrete_model
    assert owner is not None
    return owner


class InventoryMixin(models.Model):
    """An abstract model for anything with a stock count.

    Class options:

    - ``stock_field``: the integer field holding the count (default
      ``"stock"``, which this mixin defines; to use another field, define it
      and set ``stock = None`` to drop the default one).
    - ``inventory_lock_options``: keyword arguments for the item locks
      (``timeout``, ``blocking_timeout``, ``auto_renew``, ``using``).
    - ``inventory_lock_name(pk)``: the lock name of an item; by default
      ``"<app_label>.<model_name>:<pk>"``, e.g. ``"shop.sku:42"``, of the
      model whose table holds the stock: a proxy or a multi-table-inheritance
      child uses its parent's, so every class of one row takes one lock.
    """

    stock = models.PositiveIntegerField(default=0)

    stock_field: ClassVar[str] = "stock"
    inventory_lock_options: ClassVar[Mapping[str, Any]] = {}

    class Meta:
        abstract = True

    @classmethod
    def inventory_lock_name(cls, pk: Any) -> str:
        return f"{_stock_owner(cls)._meta.label_lower}:{pk}"

    @classmethod
    def _inventory_db(cls, instance: models.Model | None = None) -> str:
        return router.db_for_write(cls, instance=instance) or DEFAULT_DB_ALIAS

    def _require_pk(self) -> Any:
        if self.pk is None:
            raise ValueError(f"{type(self).__name__} must be saved before its stock can change.")
        return self.pk

    def deduct(self, quantity: int = 1) -> int:
        """Remove ``quantity`` from stock; return the stock left.

        Runs in one transaction (a savepoint inside an outer one) under the
        item's lock, which is held until the outermost transaction ends.
        Raises ``InsufficientStock`` (nothing changed) when there is not
        enough, ``LockTimeout`` when the lock cannot be had in time, and
        ``ValueError`` for a quantity that is not a positive int.
        """
        quantity = type(self)._check_quantity(quantity)
        pk = self._require_pk()
        left = type(self)._deduct({pk: quantity}, self._inventory_db(self))[pk]
        setattr(self, self.stock_field, left)
        return left

    @classmethod
    def deduct_many(cls, cart: Mapping[Any, int]) -> dict[Any, int]:
        """Deduct several items all or nothing (a cart); return ``{pk: stock left}``.

        Keys are instances of this model or primary keys. The items' locks are
        taken together through ``MultiLock`` (in one canonical order, so two
        carts sharing items never deadlock) and held until the outermost
        transaction ends. If any item is short, ``InsufficientStock`` names it
        and no item's stock changes. Instances given as keys get their stock
        field updated.
        """
        if not isinstance(cart, Mapping):
            raise TypeError(
                f"cart must be a mapping of item to quantity, not {type(cart).__name__}."
            )
        if not cart:
            raise ValueError("cart must not be empty.")
        quantities: dict[Any, int] = {}
        instances: list[InventoryMixin] = []
        for item, quantity in cart.items():
            if isinstance(item, models.Model):
                if not isinstance(item, cls):
                    raise TypeError(
                        f"cart holds a {type(item).__name__}; {cls.__name__}.deduct_many "
                        f"takes {cls.__name__} instances or primary keys."
                    )
                pk = item._require_pk()
                instances.append(item)
            else:
                pk = cls._to_pk(item)
            if pk in quantities:
                raise ValueError(f"cart names {cls.__name__} {pk!r} more than once.")
            quantities[pk] = cls._check_quantity(quantity, f"quantity of {cls.__name__} {pk!r}")
        left = cls._deduct(quantities, cls._cart_db(instances))
        for instance in instances:
            setattr(instance, cls.stock_field, left[instance.pk])
        return left

    @classmethod
    def _cart_db(cls, instances: list[InventoryMixin]) -> str:
        """The database of a cart: that of its instances (routed as ``deduct()``
        routes one), which must be one; the router's default for bare keys."""
        found = sorted({cls._inventory_db(instance) for instance in instances})
        if len(found) > 1:
            raise ValueError(
                f"cart holds {cls.__name__} instances of databases {found[0]!r} and "
                f"{found[1]!r}; deduct each database's items separately."
            )
        return found[0] if found else cls._inventory_db()

    @classmethod
    def _check_quantity(cls, quantity: object, argument: str = "quantity") -> int:
        """A positive int the stock field can hold (``_stock_limit``): a larger
        one is an overflow inside the transaction."""
        quantity = check_quantity(quantity, argument)
        limit = cls._stock_limit()
        if quantity > limit:
            raise ValueError(
                f"{argument} {quantity!r} is out of range for {cls.__name__}."
                f"{cls.stock_field}: it holds at most {limit}."
            )
        return quantity

    @classmethod
    def _stock_limit(cls) -> int:
        """The most the stock field holds: its validators' range on this
        database, and a signed 64-bit integer at most (Django 4.2 gives
        SQLite's fields no range)."""
        field = cls._meta.get_field(cls.stock_field)
        limit = MAX_QUANTITY
        for validator in getattr(field, "validators", ()):
            if isinstance(validator, MaxValueValidator):
                value = validator.limit_value
                limit = min(limit, value() if callable(value) else value)
        return limit

    @classmethod
    def _to_pk(cls, value: object) -> Any:
        field = cls._meta.pk
        if field is None:  # pragma: no cover - concrete models always have one
            return value
        if isinstance(value, bool | float | Decimal):  # to_python would truncate them
            raise ValueError(f"cart key {value!r} is not a {cls.__name__} nor its primary key.")
        try:
            return field.to_python(value)
        except ValidationError as exc:
            raise ValueError(
                f"cart key {value!r} is not a {cls.__name__} nor its primary key."
            ) from exc

    @classmethod
    def _stock_row(cls, pk: Any, using: str) -> models.QuerySet[Any]:
        """The row of ``pk`` in the table that holds the stock, alone, so that a
        guard filtered on it is in the ``UPDATE``'s own ``WHERE``. Through a
        multi-table child, Django updates a parent's field with a ``SELECT``
        of the ids that match and then an ``UPDATE`` by id: a deduction
        committed in between (by a buyer whose lock was lost) passed the
        guard, and the stock went below zero. ``DoesNotExist`` when ``pk`` is
        a parent row that is none of this model's."""
        owner = _stock_owner(cls)
        child = owner is not cls._meta.concrete_model
        if child and not cls._base_manager.using(using).filter(pk=pk).exists():
            raise cls.DoesNotExist(f"{cls.__name__} {pk!r} does not exist.")
        return owner._base_manager.using(using).filter(pk=pk)

    @classmethod
    def _deduct(cls, quantities: Mapping[Any, int], using: str) -> dict[Any, int]:
        field = cls.stock_field
        with transaction.atomic(using=using):
            connection = transaction.get_connection(using)
            # a transaction that can only roll back would fail at its first
            # query, holding the items' locks until it ends: fail before them
            connection.validate_no_broken_transaction()
            transactions.hold_until_transaction_end(
                [cls.inventory_lock_name(pk) for pk in quantities],
                using,
                cls.inventory_lock_options,
            )
            returning = _update_returning_sql(cls, connection)
            pk_field = _stock_owner(cls)._meta.pk
            assert pk_field is not None
            left: dict[Any, int] = {}
            for pk in sorted(quantities, key=str):
                quantity = quantities[pk]
                row = cls._stock_row(pk, using)
                stock: int | None = None
                if returning is not None:
                    # one round trip inside the lock instead of two
                    with connection.cursor() as cursor:
                        db_pk = pk_field.get_db_prep_value(pk, connection)
                        cursor.execute(returning, [quantity, db_pk, quantity])
                        returned = cursor.fetchone()
                    changed = returned is not None
                    stock = returned[0] if returned is not None else None
                else:
                    changed = bool(
                        row.filter(**{f"{field}__gte": quantity}).update(
                            **{field: F(field) - quantity}
                        )
                    )
                if stock is None:
                    stock = row.values_list(field, flat=True).first()
                if not changed:
                    raise cls._insufficient(pk, stock, quantity)
                assert stock is not None
                left[pk] = stock
            return left

    @classmethod
    def _insufficient(cls, pk: Any, stock: int | None, quantity: int) -> Exception:
        if stock is None:
            return cls.DoesNotExist(f"{cls.__name__} {pk!r} does not exist.")
        return InsufficientStock(
            f"{cls.__name__} {pk!r}: {quantity} requested, {stock} available.",
            item=pk,
            available=stock,
            requested=quantity,
        )

    def restock(self, quantity: int) -> int:
        """Add ``quantity`` to stock; return the new stock.

        Needs no lock: ``stock = stock + q`` is atomic in the database and can
        never oversell; a deduction waiting for the row sees the new figure.
        """
        cls = type(self)
        quantity = cls._check_quantity(quantity)
        pk = self._require_pk()
        field = self.stock_field
        using = self._inventory_db(self)
        # Guarded like a deduction: past the field's range PostgreSQL raises
        # inside the transaction and SQLite turns the stock into a float.
        limit = cls._stock_limit()
        room = {f"{field}__lte": limit - quantity}
        with transaction.atomic(using=using):
            row = cls._stock_row(pk, using)
            if not row.filter(**room).update(**{field: F(field) + quantity}):
                if not row.exists():
                    raise cls.DoesNotExist(f"{cls.__name__} {pk!r} does not exist.")
                raise ValueError(
                    f"restocking {quantity} would take {cls.__name__}.{field} of {pk!r} "
                    f"past {limit}, the most it holds; nothing was changed."
                )
            stock: int = row.values_list(field, flat=True).get()
        setattr(self, field, stock)
        return stock


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
        permissions = [
            ("release_lock", _("Can force-release held locks")),
            ("take_over_edit_lease", _("Can take over another user's admin edit lease")),
        ]
        verbose_name = _("held lock")
        verbose_name_plural = _("held locks")

    def __str__(self) -> str:
        return self.name
