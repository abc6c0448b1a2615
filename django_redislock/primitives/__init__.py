"""The primitives users hold: `Lock`, `AsyncLock`, `Semaphore`, `ReadWriteLock`, `MultiLock`.

Re-exported from ``django_redislock``. `Redlock` lives in ``primitives.redlock``, which
no other primitive imports, so a plain `Lock` never loads its per-server thread pools.
"""
