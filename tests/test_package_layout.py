"""The package's shape, as issue #42 set it: short functions, no import cycle, a
small top level, shallow primitives. Read from the source with ``ast``; nothing
is imported but the primitives whose classes are counted.

``lint-imports`` (the layers contract in ``pyproject.toml``) cannot see the
cycle checked here: grimp resolves ``from package import module`` to the
module. Python does not: it runs ``package/__init__.py`` first, and reads
``module`` off the package, so a package whose ``__init__`` imports a module
that imports its sibling through the package (``redlock/__init__`` ->
``redlock.lock`` -> ``from ...redlock import fanout``) reads a half-built
package. The root package is left out: its ``__init__`` is the public
façade, first on every import of the package, and ``from django_redislock
import signals`` is the Django-app idiom.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import django_redislock
from django_redislock import (
    AsyncLeadership,
    AsyncLock,
    AsyncReadWriteLock,
    AsyncSemaphore,
    Leadership,
    Lock,
    MultiLock,
    ReadWriteLock,
    Redlock,
    Semaphore,
)
from django_redislock.primitives.rwlock import AsyncReadLock, AsyncWriteLock, ReadLock, WriteLock

PACKAGE = Path(django_redislock.__file__).parent
ROOT = "django_redislock"

#: The longest a function may be, decorators and docstring included.
LONGEST_FUNCTION = 60
#: How many modules the package's top level may hold (``apps``, ``checks`` and
#: what users import; internals live in the layer folders).
TOP_LEVEL_MODULES = 22
#: The most classes a lock's MRO may hold, ``object`` counted (trio's ``Lock``
#: has 4): what a handle shares is composed (the holder's bookkeeping,
#: ``holds/registry.Handles``; the ``with`` blocks, ``primitives/guarded``; the
#: loss API, ``primitives/told``), not mixed in.
LOCK_MRO = 5
#: Every other public primitive's, as issue #42 left it: none may grow.
MROS = {
    Semaphore: 7,
    AsyncSemaphore: 7,
    ReadLock: 7,
    WriteLock: 7,
    AsyncReadLock: 7,
    AsyncWriteLock: 7,
    ReadWriteLock: 5,
    AsyncReadWriteLock: 5,
    MultiLock: 3,
    Redlock: 3,
    Leadership: 4,
    AsyncLeadership: 4,
}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """What running ``name`` imports: ``from p import m`` reads package ``p``
    (its ``__init__`` runs first) as well as module ``p.m``. Imports under
    ``if TYPE_CHECKING:`` never run."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, base] if base else up)
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in child.names)
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {module for module in found if module in modules and module not in (name, ROOT)}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


def test_no_import_cycle() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_check_sees_an_import_through_the_package() -> None:
    graph = {
        "p": {"p.lock"},  # p/__init__.py: from p.lock import Lock
        "p.lock": {"p", "p.fanout"},  # p/lock.py: from p import fanout
        "p.fanout": set(),
    }
    assert _cycles(graph) == [["p", "p.lock"]]


def test_no_function_is_over_60_lines() -> None:
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                assert node.end_lineno is not None
                if node.end_lineno - start + 1 > LONGEST_FUNCTION:
                    long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert long == []


def test_the_top_level_holds_at_most_22_modules() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, top


@pytest.mark.parametrize("lock", [Lock, AsyncLock])
def test_a_lock_s_mro_is_at_most_5_classes(lock: type) -> None:
    assert len(lock.__mro__) <= LOCK_MRO, [cls.__name__ for cls in lock.__mro__]


@pytest.mark.parametrize("primitive", list(MROS), ids=lambda primitive: primitive.__name__)
def test_no_public_primitive_s_mro_grows(primitive: type) -> None:
    assert len(primitive.__mro__) <= MROS[primitive], [cls.__name__ for cls in primitive.__mro__]
