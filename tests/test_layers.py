"""Imports run one way: the floors of docs/architecture.md, checked on the source.

A room is a top-level module of ``mlxbun_core`` or a top-level package of it (``engine/``,
``server/`` ...). Every import counts, also those under ``TYPE_CHECKING`` and inside
functions: a type checker and a reader follow them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mlxbun_core"

# The floor of records and contract: each room may import only the rooms named here.
BELOW = {
    "errors.py": set(),
    "holdback.py": set(),
    "events.py": set(),
    "model.py": set(),
    "grammar/": {"errors.py"},
    "media/": {"errors.py", "fspaths.py"},
    "contract.py": {"events.py", "model.py", "grammar/", "media/"},
    "hookspecs.py": {"contract.py", "model.py"},
    "plugins.py": {"hookspecs.py", "model.py"},
}
# Never, whatever else changes: the flow is surface -> engine -> toolcalls / grammar.
NEVER = [("engine/", "server/"), ("toolcalls/", "engine/"), ("toolcalls/", "server/"),
         ("grammar/", "plugins.py"), ("grammar/", "hookspecs.py")]
# Loops among rooms that are known and being removed; a loop may only shrink.
KNOWN_LOOPS = [{"library/", "loader.py", "models/"}, {"cli.py", "isolate/"}]


def room_of(module: str) -> str:
    parts = module.split(".")
    path = PACKAGE.joinpath(*parts[1:])
    return parts[1] + "/" if len(parts) > 2 or path.is_dir() else parts[1] + ".py"


def imports() -> dict[str, set[str]]:
    """Room -> the rooms its files import (itself left out)."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        modules[name] = path
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name == "mlxbun_core":
            continue  # the package's face re-exports; it is no room
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                head = ".".join(base[:len(base) - node.level + 1]) if node.level else ""
                target = ".".join(p for p in (head, node.module) if p)
                found = [f"{target}.{a.name}" for a in node.names] + [target]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            for t in found:
                while t and t not in modules:  # a name imported from a module: the module
                    t = t.rpartition(".")[0]
                if t.startswith("mlxbun_core.") and room_of(t) != room_of(name):
                    edges.setdefault(room_of(name), set()).add(room_of(t))
    return edges


EDGES = imports()


@pytest.mark.parametrize("room", sorted(BELOW))
def test_the_contract_floor_imports_only_what_stands_below_it(room):
    assert EDGES.get(room, set()) <= BELOW[room]


@pytest.mark.parametrize("room,above", NEVER)
def test_no_import_runs_back_up(room, above):
    assert above not in EDGES.get(room, set())


def test_no_new_import_loops():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in EDGES.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            loop = set()
            while True:
                w = stack.pop()
                loop.add(w)
                if w == v:
                    break
            if len(loop) > 1:
                loops.append(loop)

    for room in sorted(EDGES):
        if room not in index:
            visit(room)
    assert [loop for loop in loops if not any(loop <= known for known in KNOWN_LOOPS)] == []
