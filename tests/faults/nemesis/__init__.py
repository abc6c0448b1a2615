"""A randomised fault-injection run of our own (Jepsen style), in CI and on demand.

Worker processes (``workers``, ``operations``) take every primitive and
read-modify-write fenced registers in the database, while the ``nemesis``
stops and kills them, restarts and pauses Redis and the Redlock servers, and
partitions, slows and resets the network; every fault and every step is logged
(``journal``), and the ``checker`` (over ``trace``) says whether any promise
was broken. ``schedule`` derives all the decisions from one seed; ``run`` puts
it together. ``python -m tests.faults.nemesis --help`` runs it from a shell;
``tests/faults/test_nemesis.py`` runs it in the suite. See docs/faults.md.
"""
