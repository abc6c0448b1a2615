"""A held lease over its life: the claim, who holds it, its renewal, its counters.

Above the engine (a hold renews and releases through it); below the primitives,
which create holds.
"""
