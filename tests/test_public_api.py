"""We use MLX, mlx-lm, mlx-vlm, mlx-audio and huggingface_hub through their public API
only: no private attribute of their objects anywhere in ``mlxbun_core/`` or the family
plugins, no private module of theirs imported, and nothing of ours written onto their
classes, modules or objects.

A private attribute is a name with one leading underscore (``_idx``, ``_next_tokens``).
Statically we cannot always tell whose object ``x`` in ``x._name`` is, so two rules check
it by name. Every ``_name`` our code reads (``x._name``, ``getattr(x, "_name")``,
``hasattr``) must be one our own code defines somewhere (a method, a module-level name,
an attribute assigned on ``self`` or a class): a name only a library defines is a reach
into its internals, which a release may rename and break us silently. And a name the
libraries themselves define (read from their installed sources) is used only on
``self``/``cls`` in a class of ours. And none of our own private names is used across
objects either: ``_name`` only on ``self``/``cls``/``super()``, never ``other._name``,
``module._name`` or ``getattr(x, "_name")`` (ACROSS would list an exception, with its
reason; it is empty).

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
    "_exit",  # os._exit: a process that must end now, without the interpreter's teardown
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


THEIRS = ("mlx", "mlx_lm", "mlx_vlm", "mlx_audio", "huggingface_hub")


def _private_imports(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of every import that names a private module or name of one of
    THEIRS (``from mlx_lm.utils import _get_classes``, ``import mlx_lm.models._x``,
    ``from huggingface_hub.utils._http import ...``): importing it is reading it."""
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
    assert not found, "private modules or names imported from a library:\n" + "\n".join(found)


def test_the_import_scan_sees_a_private_import():
    tree = ast.parse("from mlx_lm.utils import _get_classes, load\n"
                     "import mlx_lm.models._private\nfrom mlx_lm._x import y\n"
                     "from os import _exit\n"
                     "from huggingface_hub.utils._http import default_client_factory\n")
    assert [w for _, w in _private_imports(tree)] == \
        ["mlx_lm.utils._get_classes", "mlx_lm.models._private", "mlx_lm._x",
         "huggingface_hub.utils._http"]


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


# -- the libraries' own private names, and writes onto their objects ------------------------
#
# The name-based check above passes any ``_name`` our code defines somewhere, so a name
# both we and a library use (``_next``, ``_processor``) slips through on the library's
# object. Below, the libraries' own private names (``self._name = ...`` and ``def _name``
# in their installed sources) may be used only on ``self``/``cls`` inside one of our
# classes, or where ACROSS says whose object it is. No library object or class is written
# to either: no ``setattr``/``type.__setattr__`` on a name imported from them, no
# attribute of ours put on their objects (``x._mlxbun*``, ``x._hooks``, ``x.__dict__[k]``).

LIBRARIES = ("mlx", "mlx_lm", "mlx_vlm", "mlx_audio", "huggingface_hub")
REQUIRED = ("mlx_lm", "mlx_audio", "huggingface_hub")  # dependencies: always installed
SELF_SET = re.compile(r"\b(?:self|cls)\.(_[A-Za-z0-9][A-Za-z0-9_]*)\s*(?::[^=\n]*)?=(?!=)")
DEF = re.compile(r"^\s*(?:async\s+)?def\s+(_[A-Za-z0-9][A-Za-z0-9_]*)\s*\(", re.M)
# ``(module, receiver, name)``: a private name used on an object that is not ``self``/
# ``cls``, each with its reason (none now: an owner that lets others use a name makes it
# public; see test_no_private_name_is_used_across_objects)
ACROSS: set[tuple[str, str, str]] = set()

# ``(module, what)``: writes onto a library that stay for now, each with its reason
PATCHES = {
    # MLX's attention function, routed for the process: mlx-lm's models call
    # mx.fast.scaled_dot_product_attention and give no hook of their own for short
    # queries (engine/attention_route.py, docs/architecture.md "Short attention") or for
    # attention straight over the batch's blocks (engine/batch/attention.py)
    ("mlxbun_core/engine/attention_route.py", "mx.fast.scaled_dot_product_attention = ..."),
    ("mlxbun_core/engine/batch/attention.py", "mx.fast.scaled_dot_product_attention = ..."),
}


def _library_sources(lib: str) -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec(lib)
    if spec is None or not spec.submodule_search_locations:
        return []
    return [p for root in spec.submodule_search_locations for p in Path(root).rglob("*.py")]


def _library_private() -> dict[str, str]:
    """Every private name the installed libraries define, and one library defining it."""
    names: dict[str, str] = {}
    for lib in LIBRARIES:
        files = _library_sources(lib)
        assert files or lib not in REQUIRED, f"{lib} is a dependency but is not installed"
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace")
            for m in (*SELF_SET.finditer(text), *DEF.finditer(text)):
                names.setdefault(m.group(1), lib)
    return names


def _our_members(trees: dict[Path, ast.AST]) -> set[str]:
    """Private names our classes define: methods, names set on ``self``/``cls``, class
    attributes (a mixin's ``self._rows`` is its partner's)."""
    out: set[str] = set()
    for tree in trees.values():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                        and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    out.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    out.add(node.id)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.add(node.value)  # __slots__, object.__setattr__(self, "_x", ...)
    return {n for n in out if PRIVATE.match(n)}


def _private_uses(tree: ast.AST) -> list[tuple[int, str, str, bool]]:
    """``(line, receiver, name, inside one of our classes)`` of every private attribute
    used: ``x._name`` (read or written) and ``getattr``/``setattr``/``hasattr`` with
    a constant name."""
    out: list[tuple[int, str, str, bool]] = []

    def visit(node: ast.AST, in_class: bool) -> None:
        in_class = in_class or isinstance(node, ast.ClassDef)
        if isinstance(node, ast.Attribute) and PRIVATE.match(node.attr):
            out.append((node.lineno, ast.unparse(node.value), node.attr, in_class))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and PRIVATE.match(node.args[1].value) \
                and (_is_setattr(node.func) or (isinstance(node.func, ast.Name)
                                                and node.func.id in ACCESSORS)):
            out.append((node.lineno, ast.unparse(node.args[0]), node.args[1].value, in_class))
        for child in ast.iter_child_nodes(node):
            visit(child, in_class)

    visit(tree, False)
    return out


def library_reaches(tree: ast.AST, rel: str, theirs: dict[str, str],
                    members: set[str]) -> list[str]:
    """The uses in ``tree`` (module ``rel``) of a name only a library may use."""
    found = []
    for line, receiver, name, in_class in _private_uses(tree):
        if name not in theirs or name in STDLIB | OTHERS or (rel, receiver, name) in ACROSS:
            continue
        if receiver in ("self", "cls") and in_class and name in members:
            continue
        found.append(f"{rel}:{line}: {receiver}.{name} ({theirs[name]} defines {name})")
    return found


def _library_names(tree: ast.AST) -> set[str]:
    """Names a module binds to something imported from one of LIBRARIES."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in LIBRARIES:
            out |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.asname or a.name.split(".")[0] for a in node.names
                    if a.name.split(".")[0] in LIBRARIES}
    return out


def _root(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def writes_onto_theirs(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of every write onto a library's class, module or object that a
    static scan can see."""
    imported = _library_names(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "__setattr__" and _root(node.func) == "type":
            out.append((node.lineno, "type.__setattr__"))  # patching a class
        elif isinstance(node, ast.Call) and node.args and (
                _is_setattr(node.func) or (isinstance(node.func, ast.Name)
                                           and node.func.id == "delattr")) \
                and _root(node.args[0]) in imported:
            out.append((node.lineno, f"setattr on {ast.unparse(node.args[0])}"))
        elif isinstance(node, ast.Attribute):
            owner, store = _root(node.value), isinstance(node.ctx, (ast.Store, ast.Del))
            if store and owner in imported:
                out.append((node.lineno, f"{ast.unparse(node)} = ..."))
            elif node.attr.startswith("_mlxbun") or \
                    (store and node.attr == "_hooks" and owner != "self"):
                out.append((node.lineno, f"{ast.unparse(node)} (ours on another object)"))
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__" \
                and _root(node.value) != "self":
            out.append((node.lineno, f"{ast.unparse(node)} = ... (another object's __dict__)"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("_mlxbun"):
            out.append((node.lineno, f"{node.value!r} (an attribute of ours, named for "
                                     "another object)"))
    return out


def test_no_library_private_name_is_used_on_their_objects():
    theirs = _library_private()
    trees = {p: ast.parse(p.read_text(encoding="utf-8"), str(p)) for p in _sources()}
    members = _our_members(trees)
    found = [hit for p, tree in trees.items()
             for hit in library_reaches(tree, str(p.relative_to(ROOT)), theirs, members)]
    assert not found, "private names of MLX, mlx-lm, mlx-vlm, mlx-audio or " \
        "huggingface_hub used outside our own classes:\n" + "\n".join(found)


def test_the_library_scan_sees_a_reach():
    """The refusal list is the libraries' own (a name each defines), and the scan flags
    their names on anything but ``self`` in a class of ours that defines them."""
    theirs = _library_private()
    assert {theirs.get("_processor"), theirs.get("_generation_batch")} <= \
        {"mlx_vlm", "mlx_audio", "mlx_lm"} and None not in \
        (theirs.get("_processor"), theirs.get("_generation_batch"))
    assert "_mlxbun_nothing" not in theirs
    tree = ast.parse("class Ours:\n    def f(self, model):\n        self._processor = 1\n"
                     "        return self._processor, model._processor, "
                     "getattr(model, '_generation_batch')\n"
                     "def g(gen):\n    return gen._processor\n")
    got = library_reaches(tree, "x.py", theirs, _our_members({Path("x.py"): tree}))
    assert [h.split(": ", 1)[1].split(" (")[0] for h in got] == \
        ["model._processor", "model._generation_batch", "gen._processor"]


def test_nothing_is_written_onto_their_classes_modules_or_objects():
    found = [f"{rel}:{line}: {what}" for p in _sources()
             for rel in [str(p.relative_to(ROOT))]
             for line, what in writes_onto_theirs(ast.parse(p.read_text(encoding="utf-8")))
             if (rel, what) not in PATCHES]
    assert not found, "writes onto library objects:\n" + "\n".join(found)


def test_the_write_scan_sees_each_kind_of_write():
    tree = ast.parse(
        "from mlx_lm.models import cache as mc\nimport mlx_lm.generate\n"
        "from mlx_lm.models.cache import KVCache\n"
        "type.__setattr__(KVCache, 'trim', f)\n"
        "mc.make_prompt_cache = f\n"
        "mlx_lm.generate.make_prompt_cache = f\n"
        "setattr(KVCache, '__deepcopy__', f)\n"
        "def h(model, module, obj, relay, self):\n"
        "    model._hooks = relay\n"
        "    self._hooks = relay\n"
        "    object.__setattr__(module, '_mlxbun_shard_mode', 'tensor')\n"
        "    obj.__dict__['uid'] = 1\n"
        "    self.__dict__['uid'] = 1\n"
        "    return module._mlxbun_shard_mode\n")
    assert [line for line, _ in sorted(writes_onto_theirs(tree))] == [4, 5, 6, 7, 9, 11, 12, 14]


# -- our own private names, across objects --------------------------------------------------
#
# The scans above know a library's names only. Ours are private to their owner too: a
# ``_name`` is used on ``self``/``cls`` (or ``super()``) only, never on another object,
# module or instance of the same class; a name another object needs is public on its owner.
# Reviews cannot tell our ``x._next`` from mlx-lm's, and neither can a reader.

OWN = ("self", "cls", "super()")


def across_objects(tree: ast.AST, rel: str) -> list[str]:
    """The uses in ``tree`` (module ``rel``) of a private name on anything but ``self``,
    ``cls`` or ``super()``."""
    return [f"{rel}:{line}: {receiver}.{name}"
            for line, receiver, name, _ in _private_uses(tree)
            if receiver not in OWN and name not in STDLIB | OTHERS
            and (rel, receiver, name) not in ACROSS]


def test_no_private_name_is_used_across_objects():
    found = [hit for p in _sources()
             for hit in across_objects(ast.parse(p.read_text(encoding="utf-8")),
                                       str(p.relative_to(ROOT)))]
    assert not found, "private names used on another object (make them public on " \
        "their owner):\n" + "\n".join(found)


def test_the_across_scan_sees_each_kind_of_use():
    tree = ast.parse(
        "import os\nfrom . import articles\n"
        "class Ours:\n"
        "    def __init__(self):\n        self._x = 1\n        super()._setup()\n"
        "    @classmethod\n    def make(cls, other):\n"
        "        view = cls._blank()\n        view._build()\n"
        "        return other._x, getattr(other, '_y'), self.rw._split('a')\n"
        "def f(b, row):\n    b._next = row._tokens\n"
        "    setattr(b, '_send', None)\n"
        "    return articles._bounds(), os._exit, row._replace(a=1)\n")
    got = [h.split(": ", 1)[1] for h in across_objects(tree, "x.py")]
    assert sorted(got) == sorted(["view._build", "other._x", "other._y", "self.rw._split",
                                  "b._next", "row._tokens", "b._send", "articles._bounds"])
