"""`Redlock`: a lock granted by a majority of independent Redis servers.

Its own folder because it runs on several servers at once: its quorum steps, its
fan-out to the servers, its servers' configuration and its holding live here and
nowhere else.
"""

from django_redislock.primitives.redlock.lock import Redlock

__all__ = ["Redlock"]
