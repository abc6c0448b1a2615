"""The admin's edit lease: one editor per object while its change form is open.

``lease`` is the Redis side (names, who holds an object, take, renew, give
up, take over); ``mixin`` is ``EditLeaseMixin`` for a ``ModelAdmin``
(re-exported as ``django_redislock.admin.EditLeaseMixin``); ``views`` are the
page's renew, release and take-over endpoints. Nothing is imported here, so
``lease`` loads without the admin (the operator tools use it to show edit
leases as such).
"""
