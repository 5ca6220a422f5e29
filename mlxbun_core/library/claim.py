"""Which plugin would claim a checkpoint, answered without loading any weights.

The library, ``/v1/models`` and ``mlxbun ls`` need the claiming plugin and the
support tier of every cached model; loading each one to find out is out of the
question. :func:`which_plugin` is the one place that asks.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .. import plugins

GENERIC = "generic"


@dataclass(frozen=True)
class Claim:
    plugin: str  # the plugin (entry-point) name
    family: str  # the family it serves the checkpoint as
    tier: str  # "targeted" (a family plugin) or "generic" (the built-in fallback)


def which_plugin(path: Path, config: dict, model_id: str = "") -> Optional[Claim]:
    """The plugin that would claim ``path`` (with its parsed ``config``), or None."""
    from .. import loader
    from ..model import LoadOptions

    identify = getattr(loader, "identify", None)  # the ``claims`` hook, where the core has it
    if identify is not None:
        found = identify(Path(path), LoadOptions(model_id=model_id), config)
        return _claim(found.plugin, found.family) if found else None
    return _from_predicates(plugins.load_plugins(), path, config, model_id)


def _claim(name: str, family: str) -> Claim:
    return Claim(name, family, "generic" if family == GENERIC else "targeted")


def _from_predicates(pm, path, config, model_id) -> Optional[Claim]:
    """Until the core has the ``claims`` hook: each plugin's own ``claims`` predicate
    (called with the arguments it names), in load order; the generic fallback last."""
    args = {"path": Path(path), "config": config, "model_id": model_id}
    generic = None
    for impl in reversed(pm.hook.load_model.get_hookimpls()):
        module = impl.plugin
        family = getattr(module, "FAMILY", impl.plugin_name)
        if family == GENERIC:
            generic = (impl.plugin_name, module)
            continue
        predicate = getattr(module, "claims", None)
        if callable(predicate):
            names = inspect.signature(predicate).parameters
            if predicate(**{n: args[n] for n in names if n in args}):
                return _claim(impl.plugin_name, family)
    if generic and mlx_lm_knows(config.get("model_type")):
        return _claim(generic[0], GENERIC)
    return None


@functools.lru_cache(maxsize=1)
def _mlx_lm_models() -> tuple[frozenset, dict]:
    """mlx-lm's model modules and its model_type remapping, read from its files:
    importing mlx_lm pulls in transformers and torch (seconds), which a listing
    must not pay."""
    spec = importlib.util.find_spec("mlx_lm")  # locates the package without running it
    root = Path(next(iter(spec.submodule_search_locations or []), "")) if spec else None
    if root is None or not (root / "models").is_dir():
        return frozenset(), {}
    names = frozenset(p.stem for p in (root / "models").glob("*.py"))
    remap = {}
    try:
        tree = ast.parse((root / "utils.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and getattr(node.targets[0], "id", None) == "MODEL_REMAPPING"):
                remap = ast.literal_eval(node.value)
    except (OSError, SyntaxError, ValueError):
        pass
    return names, remap


def mlx_lm_knows(model_type) -> bool:
    """Whether mlx-lm ships a model definition for ``model_type`` (no mlx_lm import)."""
    if not model_type:
        return False
    names, remap = _mlx_lm_models()
    return remap.get(model_type, model_type).replace("-", "_") in names
