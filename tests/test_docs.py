"""The guarantees page names the tests that prove each claim: they must exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_test_named_in_guarantees_exists() -> None:
    page = (ROOT / "docs" / "guarantees.md").read_text()
    defined: dict[str, set[str]] = {}
    for path in (ROOT / "tests").glob("test_*.py"):
        defined[path.name] = set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
    everywhere = set().union(*defined.values())
    named = re.findall(r"`(?:(test_\w+\.py)::)?(test_\w+)(?:\[\w+\])?\*?`", page)
    assert len(named) > 20, "the guarantees page names too few tests"
    missing = []
    for module, test in named:
        if test.endswith("_"):  # a prefix such as test_lost_*
            if not any(name.startswith(test) for name in everywhere):
                missing.append(test)
        elif test not in (defined.get(module, set()) if module else everywhere):
            missing.append(f"{module}::{test}" if module else test)
    assert not missing, f"docs/guarantees.md names tests that do not exist: {missing}"
    for module in re.findall(r"`(test_\w+\.py)`", page):
        assert module in defined, f"docs/guarantees.md names a missing module {module}"


def test_readme_links_are_absolute_and_point_at_files_that_exist() -> None:
    """A package index shows the README without the repository: relative links
    break there. Every link names the repository, and the file it names exists."""
    root = ROOT
    readme = (root / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+)\)", readme)
    assert links
    home = "https://github.com/django-redislock/django-redislock/blob/main/"
    raw = "https://raw.githubusercontent.com/django-redislock/django-redislock/main/"
    for link in links:
        assert link.startswith(("https://", "http://")), f"relative link {link!r}"
        for base in (home, raw):
            if link.startswith(base):
                path = link[len(base) :].split("#", 1)[0]
                assert (root / path).is_file(), f"{link!r}: no file {path}"
