"""Imports run one way: the floors of docs/architecture.md, checked on the source of
the core and of the family plugins under ``plugins/``.

A room is a top-level module of ``mlxbun_core`` or a top-level package of it (``engine/``,
``server/`` ...). Every import counts, also those under ``TYPE_CHECKING`` and inside
functions: a type checker and a reader follow them all. No two rooms import each other,
and no two modules either, not even inside one room.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mlxbun_core"

# The floor of records and contract: each room may import only the rooms named here (and
# the run configuration, which every floor reads).
BELOW = {
    "errors.py": set(),
    "holdback.py": set(),
    "events.py": set(),
    "model.py": {"sidetable.py"},  # (the shard plan's record of what it applied)
    "grammar/": {"errors.py"},
    "media/": {"errors.py", "fspaths.py", "runconfig.py"},
    "contract.py": {"events.py", "model.py", "grammar/", "media/"},
    "hookspecs.py": {"contract.py", "model.py", "speech/"},
    "speech/": {"errors.py"},
    "plugins.py": {"hookspecs.py", "model.py", "runconfig.py"},
}
# Never, whatever else changes: the flow is surface -> engine -> toolcalls / grammar.
NEVER = [("engine/", "server/"), ("toolcalls/", "engine/"), ("toolcalls/", "server/"),
         ("grammar/", "plugins.py"), ("grammar/", "hookspecs.py")]
# The floors of docs/architecture.md, from the ground up: a room imports rooms of its own
# floor or below, never above. A new room gets its floor here (and a line in the doc).
FLOORS = [
    # records: plain data and self-contained helpers; nothing of ours (fspaths -> errors,
    # runconfig -> env_readers)
    {"errors.py", "events.py", "model.py", "holdback.py", "system_turns.py", "fspaths.py",
     "kvquant/", "blas/", "torchless.py", "sqlitefile.py", "fdlimit.py", "request_fields.py",
     "runconfig.py", "env_readers.py", "refused_flags.py", "sequences.py", "sidetable.py",
     "backend.py", "cache_ops.py"},
    # formats and files: grammar requests, media parts, model files, the SSD cache's files
    {"grammar/", "media/", "models/", "kvstore/", "speech/"},
    # the contract plugins implement
    {"contract.py", "hookspecs.py"},
    # plugin machinery: the manager, claiming, the grammar backends
    {"plugins.py", "loader.py", "grammar_registry.py"},
    # helpers shared by plugins and the engine
    {"toolcalls/", "chat_template.py", "family.py", "experts/"},
    {"plugins_builtin/"},
    # the local library, and choosing a model from it
    {"library/", "selection.py"},
    {"engine/", "adapters/", "jobs/", "memory/", "distributed/"},
    # configuration read at start-up
    {"config/"},
    # what reads the engine: surfaces and their observers
    {"server/", "webchat/", "metrics/", "hub/"},
    # the web app's routes, on top of the surfaces (nothing in server/ imports them)
    {"webapp/"},
    # entry points
    {"startup.py", "cli.py", "serve_flags.py", "serve_switches.py", "isolate/", "testing/",
     "dist_serve.py", "console/", "launch/"},
]
FLOOR = {room: n for n, rooms in enumerate(FLOORS) for room in rooms}
# Loops among rooms that are known and being removed; none are left, keep it so.
KNOWN_LOOPS: list[set[str]] = []


def room_of(module: str) -> str:
    parts = module.split(".")
    path = PACKAGE.joinpath(*parts[1:])
    return parts[1] + "/" if len(parts) > 2 or path.is_dir() else parts[1] + ".py"


def modules_of(package: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a directory)."""
    modules = {}
    for path in package.rglob("*.py"):
        rel = path.relative_to(package.parent).with_suffix("")
        modules[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return modules


def module_imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours (``mlxbun_*``) it imports (``from pkg import sub``:
    the submodule)."""
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                head = ".".join(base[:len(base) - node.level + 1]) if node.level else ""
                target = ".".join(p for p in (head, node.module) if p)
                found = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target
                         for a in node.names]
            elif isinstance(node, ast.Import):
                found = [a.name for a in node.names]
            else:
                continue
            for t in found:
                while t and t not in modules:  # a name imported from a module: the module
                    t = t.rpartition(".")[0]
                if t.startswith("mlxbun_") and t != name:
                    edges.setdefault(name, set()).add(t)
    return edges


def room_imports(modules: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the rooms its files import (itself left out)."""
    edges: dict[str, set[str]] = {}
    for name, targets in modules.items():
        if name == "mlxbun_core":
            continue  # the package's face re-exports; it is no room
        for t in targets:
            if t != "mlxbun_core" and room_of(t) != room_of(name):
                edges.setdefault(room_of(name), set()).add(room_of(t))
    return edges


# the family plugins' packages (plugins/<name>/mlxbun_<name>/), read with the core
PLUGIN_PACKAGES = sorted(p for p in (PACKAGE.parent / "plugins").glob("*/mlxbun_*")
                         if (p / "__init__.py").is_file())
ALL_EDGES = module_imports({name: path for package in [PACKAGE, *PLUGIN_PACKAGES]
                            for name, path in modules_of(package).items()})
MODULE_EDGES = {name: {t for t in targets if t.startswith("mlxbun_core")}
                for name, targets in ALL_EDGES.items() if name.startswith("mlxbun_core")}
EDGES = room_imports(MODULE_EDGES)
PLUGIN_FLOOR = FLOOR["plugins_builtin/"]  # where docs/architecture.md puts every family


def loops_in(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return loops


@pytest.mark.parametrize("room", sorted(BELOW))
def test_the_contract_floor_imports_only_what_stands_below_it(room):
    assert EDGES.get(room, set()) <= BELOW[room]


@pytest.mark.parametrize("room,above", NEVER)
def test_no_import_runs_back_up(room, above):
    assert above not in EDGES.get(room, set())


def test_every_room_has_a_floor():
    rooms = {room_of(m) for m in MODULE_EDGES if m != "mlxbun_core"} | set(EDGES)
    assert sorted(rooms - set(FLOOR)) == []  # give it a floor in FLOORS and the doc's table


@pytest.mark.parametrize("room", sorted(FLOOR))
def test_imports_run_down_the_floors(room):
    above = {t: FLOOR.get(t) for t in EDGES.get(room, ())
             if FLOOR.get(t, len(FLOORS)) > FLOOR[room]}
    assert above == {}, f"{room} (floor {FLOOR[room]}) imports rooms above it"


def test_no_new_import_loops():
    loops = loops_in(EDGES)
    assert [loop for loop in loops if not any(loop <= known for known in KNOWN_LOOPS)] == []


def test_the_core_never_imports_a_family_plugin():
    reach = {name: sorted(t for t in targets if not t.startswith("mlxbun_core"))
             for name, targets in ALL_EDGES.items() if name.startswith("mlxbun_core")}
    assert {name: found for name, found in reach.items() if found} == {}


@pytest.mark.parametrize("package", [p.name for p in PLUGIN_PACKAGES])
def test_family_plugins_import_only_their_floor_and_below(package):
    """A family plugin stands on the plugins' floor: the contract, the shared helpers,
    the formats below them; never the library, the engine or a surface, nor another
    family."""
    assert len(PLUGIN_PACKAGES) >= 5  # the five families: the scan found their code
    used: dict[str, set[str]] = {}
    for name, targets in ALL_EDGES.items():
        if name.split(".")[0] == package:
            for t in targets:
                if t.split(".")[0] != package:
                    used.setdefault(room_of(t) if t.startswith("mlxbun_core.") else t,
                                    set()).add(name)
    above = {room: sorted(users) for room, users in used.items()
             if FLOOR.get(room, len(FLOORS)) > PLUGIN_FLOOR}
    assert above == {}, f"{package} imports what stands above the plugins' floor"


def test_the_architecture_doc_shows_these_floors():
    """docs/architecture.md's floors table names the same rooms on the same floors."""
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    table = re.findall(r"^\| (\d+) [^|]+\| ([^|]+) \|", doc, re.M)
    floors = []
    for number, cell in table:
        while re.search(r"\([^()]*\)", cell):  # what stands in parentheses explains a room
            cell = re.sub(r"\([^()]*\)", "", cell)
        floors.append((int(number), {r for r in re.findall(r"`([^`<]+)`", cell)}))
    assert [n for n, _ in floors] == list(range(len(FLOORS)))
    assert [rooms for _, rooms in floors] == FLOORS


def test_no_two_modules_import_each_other():
    """Not even inside one room: the turn that reaches back into its agent, the module
    that needs a name from the one importing it. Move the shared part below both."""
    assert loops_in(ALL_EDGES) == []
