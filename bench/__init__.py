"""Benchmarks of django-redislock's ``Lock`` against its peers, in one run.

``python -m bench`` (or ``bash scripts/bench``) starts a private
``redis-server``, measures every library against it in interleaved blocks and
prints medians, same-run ratios to the raw ``SET NX PX`` floor, and the targets
as PASS/FAIL. See ``docs/benchmarks.md``.
"""
