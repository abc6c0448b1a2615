"""The acquire as sans-I/O steps, and the thin sync and asyncio drivers that run them.

Also what bounds a command by a deadline (`bounds`, `workers`). Knows no primitive
and no hold: it only turns steps into Redis calls and replies back into steps.
"""
