"""We use MLX and mlx-lm through their public API only: no private attribute of their
objects anywhere in ``mlxbun_core/`` or the family plugins.

A private attribute is a name with one leading underscore (``_idx``, ``_next_tokens``).
Statically we cannot always tell whose object ``x`` in ``x._name`` is, so the rule is
checked by name: every ``_name`` our code reads (``x._name``, ``getattr(x, "_name")``,
``hasattr``) must be one our own code defines somewhere (a method, a module-level name,
an attribute assigned on ``self`` or a class). A name only MLX or mlx-lm defines is a
reach into their internals: a release may rename it and break us silently.

The pinned versions (``pyproject.toml``) are checked too: ``mlx`` and ``mlx-lm`` are
held to the minor versions the suite has run on, and the installed ones are within.
"""

from __future__ import annotations

import ast
import re
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = [ROOT / "mlxbun_core", *sorted((ROOT / "plugins").glob("*/mlxbun_*"))]
PRIVATE = re.compile(r"^_[A-Za-z0-9][A-Za-z0-9_]*$")  # one underscore: not a dunder
ACCESSORS = {"getattr", "hasattr", "setattr", "delattr"}
# The standard library's underscored names that are documented, or that argparse's own
# documentation points subcommand code at; not MLX's or mlx-lm's business either way.
STDLIB = {
    "_replace",  # namedtuple's documented copy-with-changes
    "_actions", "_SubParsersAction", "_StoreTrueAction", "_StoreFalseAction",
    "_AppendAction",  # argparse: walking a parser's options (config show, isolate launch)
}
# Other libraries' underscored names that a subclass of theirs calls on itself; not MLX's
# or mlx-lm's either.
OTHERS = {
    # uvicorn's HttpToolsProtocol, which the connection guard (server/connections.py)
    # extends; uvicorn is held to the minor version the suite runs on
    "_should_upgrade",
}


def _sources() -> list[Path]:
    return [p for tree in TREES for p in sorted(tree.rglob("*.py"))]


def _defined(tree: ast.AST) -> set[str]:
    """Private names a module defines: functions, classes, module or class names,
    attributes it assigns (``self._x = ...``, ``obj._x = ...``), slots and imports."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[-1])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names |= {c.value for c in ast.walk(node.value)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and _is_setattr(node.func):
            names.add(str(node.args[1].value))  # setattr / object.__setattr__(x, "_x", v)
    return {n for n in names if PRIVATE.match(n)}


def _is_setattr(func: ast.expr) -> bool:
    return (isinstance(func, ast.Name) and func.id == "setattr") or \
        (isinstance(func, ast.Attribute) and func.attr == "__setattr__")


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, name)`` of every private attribute read: ``x._name`` and
    ``getattr(x, "_name")`` (and ``hasattr``)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) \
                and PRIVATE.match(node.attr):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ACCESSORS and len(node.args) >= 2:
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) \
                    and PRIVATE.match(arg.value):
                out.append((node.lineno, arg.value))
    return out


def test_no_private_attribute_of_mlx_or_mlx_lm_is_read():
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in _sources()}
    ours: set[str] = set()
    for tree in trees.values():
        ours |= _defined(tree)
    reaches = [f"{p.relative_to(ROOT)}:{line}: ._{name[1:]}"
               for p, tree in trees.items() for line, name in _reads(tree)
               if name not in ours and name not in STDLIB | OTHERS]
    assert not reaches, "private attributes of objects we do not own:\n" + "\n".join(reaches)


def test_the_scan_sees_a_reach():
    """The scan itself: a read of a name only mlx-lm defines is caught."""
    tree = ast.parse("def f(gen):\n    return gen._generation_batch, getattr(gen, '_idx')\n")
    assert [n for _, n in _reads(tree) if n not in _defined(tree)] == \
        ["_generation_batch", "_idx"]


THEIRS = ("mlx", "mlx_lm", "mlx_vlm")


def _private_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of every import that names a private module or name of MLX,
    mlx-lm or mlx-vlm (``from mlx_lm.utils import _get_classes``,
    ``import mlx_lm.models._x``): importing it is reading it."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] not in THEIRS:
                continue
            if any(PRIVATE.match(part) for part in parts):
                out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                    if PRIVATE.match(a.name)]
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names
                    if a.name.split(".")[0] in THEIRS
                    and any(PRIVATE.match(part) for part in a.name.split("."))]
    return out


def test_no_private_module_or_name_of_mlx_or_mlx_lm_is_imported():
    found = [f"{p.relative_to(ROOT)}:{line}: {what}" for p in _sources()
             for line, what in _private_imports(ast.parse(p.read_text(encoding="utf-8")))]
    assert not found, "private names imported from MLX or mlx-lm:\n" + "\n".join(found)


def test_the_import_scan_sees_a_private_import():
    tree = ast.parse("from mlx_lm.utils import _get_classes, load\n"
                     "import mlx_lm.models._private\nfrom mlx_lm._x import y\n"
                     "from os import _exit\n")
    assert [w for _, w in _private_imports(tree)] == \
        ["mlx_lm.utils._get_classes", "mlx_lm.models._private", "mlx_lm._x"]


def _pins() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    deps = re.findall(r'"(mlx(?:-lm)?)(?:\[[a-z0-9]+\])?([<>=!~][^";]*)', text)
    return {name: spec for name, spec in deps}


def test_mlx_and_mlx_lm_are_pinned_to_a_minor_version_and_installed_within_it():
    from packaging.specifiers import SpecifierSet

    pins = _pins()
    for name in ("mlx", "mlx-lm"):
        spec = SpecifierSet(pins[name])
        assert any(s.operator == "<" for s in spec), f"{name} has no upper bound: {spec}"
        assert version(name) in spec, f"installed {name} {version(name)} is outside {spec}"
