"""The guarantees page names the tests that prove each claim: they must exist."""

from __future__ import annotations

import ast
import builtins
import re
import symtable
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Pages whose Python blocks are meant to be pasted into a project as they are
#: (others, such as semaphores.md, sketch with placeholders like ``build_export()``).
RECIPE_PAGES = [
    "api.md",
    "celery.md",
    "commands.md",
    "decorators.md",
    "drf.md",
    "faults.md",
    "metrics.md",
    "migrating.md",
    "once.md",
    "quickstart.md",
    "settings.md",
    "testing-your-project.md",
]


def test_every_test_named_in_guarantees_exists() -> None:
    page = (ROOT / "docs" / "guarantees.md").read_text()
    defined: dict[str, set[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        tests = set(re.findall(r"^(?:async )?def (test_\w+)", path.read_text(), re.M))
        defined[path.relative_to(ROOT).as_posix()] = tests
        defined.setdefault(path.name, set()).update(tests)
    everywhere = set().union(*defined.values())
    named = re.findall(r"`(?:((?:tests/)?[\w/]*test_\w+\.py)::)?(test_\w+)(?:\[\w+\])?\*?`", page)
    assert len(named) > 20, "the guarantees page names too few tests"
    missing = []
    for module, test in named:
        if test.endswith("_"):  # a prefix such as test_lost_*
            if not any(name.startswith(test) for name in everywhere):
                missing.append(test)
        elif test not in (defined.get(module, set()) if module else everywhere):
            missing.append(f"{module}::{test}" if module else test)
    assert not missing, f"docs/guarantees.md names tests that do not exist: {missing}"
    for module in re.findall(r"`((?:tests/)?[\w/]*test_\w+\.py)`", page):
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


def _unbound_names(code: str) -> set[str]:
    """Global names ``code`` reads but neither imports nor assigns, at any depth."""
    top = symtable.symtable(code, "<block>", "exec")
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        read |= {
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and (table is top or s.is_global())
        }
        tables.extend(table.get_children())
    return read - bound - set(dir(builtins))


@pytest.mark.parametrize("page", RECIPE_PAGES)
def test_each_recipe_block_imports_what_it_uses(page: str) -> None:
    """A block pasted on its own runs: it imports every name it uses, except
    the functions and classes an earlier block of the page defines."""
    text = (ROOT / "docs" / page).read_text()
    # a block inside a list item is indented with it
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]
    assert blocks, f"docs/{page} has no Python block"
    defined: set[str] = set()
    for number, code in enumerate(blocks, 1):
        missing = _unbound_names(code) - defined
        assert not missing, f"docs/{page}, Python block {number}: {sorted(missing)} not imported"
        defined |= {
            node.name
            for node in ast.parse(code).body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }


def test_pages_say_what_a_reader_following_them_literally_needs() -> None:
    """Each trip of a reader who followed a page literally (#43): a free
    ``import_feed("stock")`` started 3 s late behind a task waiting on its
    lock; the xdist fixture errored every test without pytest-xdist."""
    celery = (ROOT / "docs" / "celery.md").read_text()
    assert "runs at once **on a free worker**" in celery
    assert "A task waiting for its lock occupies its worker" in celery
    testing = (ROOT / "docs" / "testing-your-project.md").read_text()
    fixture = testing.index("def _lock_prefix_per_worker(worker_id)")
    assert "needs pytest-xdist installed" in testing[:fixture]
    assert "fixture 'worker_id' not found" in testing[:fixture]
