"""Each Lua script's call spec (``scripts.Script``'s KEYS and ARGV names) is
the one its header comment documents, and callers build lists by name."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from django_redislock.backend import scripts
from django_redislock.backend.scripts import LOCK_ACQUIRE, LOCK_RELEASE, Command, Script

_HEADER = re.compile(r"^-- (KEYS|ARGV)\[(\d+)\]\s+(\w+)(.*)$")

#: The Lua scripts (a ``Command`` is a plain command: no file, no header).
SCRIPTS = [
    s for s in vars(scripts).values() if isinstance(s, Script) and not isinstance(s, Command)
]


def header(script: Script) -> list[str]:
    """The comment lines the script's file starts with."""
    lines = scripts._read(script.name).splitlines()
    return lines[: next(i for i, line in enumerate(lines) if not line.startswith("--"))]


def documented(script: Script) -> tuple[list[str], list[str], set[str]]:
    """KEYS names, ARGV names and the ones marked optional, from the header."""
    found: dict[str, list[tuple[int, str]]] = {"KEYS": [], "ARGV": []}
    optional: set[str] = set()
    for line in header(script):
        match = _HEADER.match(line)
        if match:
            kind, index, name, rest = match.groups()
            found[kind].append((int(index), name))
            if "optional" in rest:
                optional.add(name)
    names = {}
    for kind, entries in found.items():
        assert [i for i, _ in entries] == list(range(1, len(entries) + 1)), (script.name, kind)
        names[kind] = [name for _, name in entries]
    return names["KEYS"], names["ARGV"], optional


def test_every_script_has_a_spec() -> None:
    """A script added without naming its KEYS (and so its ARGV) fails here."""
    unnamed = {
        name: s.name
        for name, s in vars(scripts).items()
        if isinstance(s, Script) and not s.key_names
    }
    assert not unnamed
    files = {f.name for f in resources.files(scripts).iterdir() if f.name.endswith(".lua")}
    preludes = {f for f in files if f.startswith("_")}
    assert {s.name for s in SCRIPTS} == files - preludes  # no .lua file left without its Script


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_a_spec_matches_the_scripts_header(script: Script) -> None:
    keys, args, optional = documented(script)
    assert list(script.key_names) == keys
    assert list(script.arg_names) == args
    assert set(script.optional) == optional
    # A per-name script says so, and a script that says so is one.
    assert script.per_name == any(line.startswith("-- Per name:") for line in header(script))


def test_a_per_name_script_takes_each_names_keys_and_args_in_turn() -> None:
    clear = scripts.CLEAR_LOCK
    names = [{"lock": f"l{i}", "queue": f"q{i}", "deadlines": f"d{i}", "x": 0} for i in (1, 2)]
    assert clear.keys_of_each(names) == ["l1", "q1", "d1", "l2", "q2", "d2"]
    args = [{"confirmed": "*"}, {"confirmed": "t"}]
    assert clear.args_of_each(args) == ["*", "t"]
    with pytest.raises(TypeError, match="deadlines"):
        clear.keys_of_each([{"lock": "l", "queue": "q"}])


def test_arguments_are_built_by_name_in_the_scripts_order() -> None:
    named = {"token": "t", "lease_ms": 1, "mode": "try", "fenced": 0, "holder": "h", "since_ms": 2}
    args = LOCK_ACQUIRE.args_of(**named, waiter_ttl_ms=3, stats_ttl_ms=0)
    assert args == ["t", 1, "try", 0, "h", 2, 3, 0]  # waited_ms, optional, left out
    assert LOCK_ACQUIRE.args_of(**named, waiter_ttl_ms=3, stats_ttl_ms=0, waited_ms=9)[-1] == 9
    keys = {"lock": "l", "fence": "f", "queue": "q", "deadlines": "d", "other": "x"}
    assert LOCK_RELEASE.keys_of(keys) == ["l", "q", "d", "f"]  # "other" is not the release's


def test_a_missing_or_unknown_argument_is_refused() -> None:
    with pytest.raises(TypeError, match="lease_ms"):
        scripts.LOCK_EXTEND.args_of(token="t")
    with pytest.raises(TypeError, match="lease"):
        scripts.LOCK_EXTEND.args_of(token="t", lease=1)
    with pytest.raises(TypeError, match="lock"):
        scripts.LOCK_EXTEND.keys_of({"fence": "f"})


def test_constants_shared_with_lua_are_defined_once_in_python() -> None:
    """The fencing counter's memory and slack are Python constants written into
    the Lua at load: no script carries them as a bare number of its own."""
    for script in SCRIPTS:
        assert "{{" not in script.text, f"{script.name}: a constant left unwritten"
    for f in resources.files(scripts).iterdir():
        if f.name.endswith(".lua"):
            raw = f.read_text(encoding="utf-8")
            assert not re.search(r"\b(9990|10000)\b", raw), f"{f.name} spells a constant out"
    fenced = scripts.LOCK_ACQUIRE.text
    limit = scripts.FENCE_MEMORY_MS - scripts.FENCE_SLACK_MS
    assert f"< {scripts.FENCE_MEMORY_MS} - {scripts.FENCE_SLACK_MS}" in fenced, limit


def test_a_fast_path_shared_by_two_scripts_is_written_once() -> None:
    """The permit primitives' common case is one file, included by both."""
    for script in (scripts.SEMAPHORE_ACQUIRE, scripts.RWLOCK_ACQUIRE):
        raw = resources.files(scripts).joinpath(script.name).read_text(encoding="utf-8")
        assert "-- @include _permit_fast.lua" in raw
        assert "redis.call('ZADD', set, '+inf'," in script.text
