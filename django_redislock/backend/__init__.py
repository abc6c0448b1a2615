"""Redis access: the client of a cache alias, the key layout, stored values and the Lua scripts.

The bottom layer of the package: it knows Redis and django-redis, and no primitive.
"""
