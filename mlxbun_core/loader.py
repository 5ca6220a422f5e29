"""From a model name to a LoadedModel: resolve files, then let plugins claim it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

from . import plugins
from .model import LoadedModel, LoadOptions

log = logging.getLogger("mlxbun.loader")

GEN_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


class NoPluginClaimed(Exception):
    pass


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def claim(path: Path, options: LoadOptions) -> LoadedModel:
    """Ask plugins in priority order; the first to return a model wins.

    Done by hand instead of a plain firstresult call so we know *which* plugin
    answered (for the banner and ``/v1/models``).
    """
    pm = plugins.load_plugins()
    config = read_json(path / "config.json")
    args = {"path": path, "config": config, "options": options}
    for impl in reversed(pm.hook.load_model.get_hookimpls()):
        model = impl.function(**{a: args[a] for a in impl.argnames})
        if model is not None:
            model.plugin = model.plugin or impl.plugin_name
            return finish(model)
    raise NoPluginClaimed(
        f"no installed plugin can load {path} (model_type={config.get('model_type')!r}); "
        "`mlxbun plugins` lists what is installed")


def finish(model: LoadedModel) -> LoadedModel:
    """Fill what every model gets regardless of family."""
    gen = read_json(model.path / "generation_config.json")
    defaults = {k: gen[k] for k in GEN_DEFAULT_KEYS if gen.get(k) is not None}
    # the checkpoint author's generation_config.json wins over a plugin's family defaults
    model.generation_defaults = {**model.generation_defaults, **defaults}
    if model.context_window is None:
        cfg = model.config.get("text_config", model.config)
        model.context_window = cfg.get("max_position_embeddings") or model.config.get(
            "max_position_embeddings")
    return model


def load(name: Optional[str], options: Optional[LoadOptions] = None, *, progress=True) -> LoadedModel:
    from .models.resolve import resolve_model

    resolved = resolve_model(name, progress=progress)
    options = options or LoadOptions()
    options.model_id = options.model_id or resolved.model_id
    log.info("loading %s from %s", resolved.model_id, resolved.path)
    return claim(Path(resolved.path), options)
