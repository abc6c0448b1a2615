"""Operator tools: what ``manage.py locks`` and the admin dashboard read, clear and draw.

The top of the core's import graph: no primitive, hold or engine module imports it.
"""
