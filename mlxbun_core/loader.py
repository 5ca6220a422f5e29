"""From a model name to a LoadedModel: resolve files, let the plugins claim the
checkpoint (``claims``), then have the claimant load it (``load_model``)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from . import plugins
from .model import LoadedModel, LoadOptions
from .models import window
from .models.unservable import refusal
from .models.window import WindowPlan
from .request_fields import checkpoint_names

log = logging.getLogger("mlxbun.loader")

GEN_DEFAULT_KEYS = checkpoint_names()  # the sampling defaults a checkpoint may set


class NoPluginClaimed(Exception):
    pass


class CannotEmbed(NoPluginClaimed):
    """``--embedding`` on a checkpoint whose family cannot embed (said at start, not
    served as a chat model instead)."""


@dataclass(frozen=True)
class Claim:
    """Who answered ``claims`` for a checkpoint: the family, and the registered
    name of the plugin that provides it."""

    family: str
    plugin: str


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def identify(path: Path, options: LoadOptions | None = None,
             config: dict | None = None) -> Claim | None:
    """Which family claims the checkpoint at ``path``, from its config alone (no
    weights read): the ``claims`` hook, through the normal hook call so wrappers
    and ``MLXBUN_TRACE_HOOKS`` see it. ``None`` when no plugin claims it."""
    path = Path(path)
    config = read_json(path / "config.json") if config is None else config
    options = options or LoadOptions(model_id=path.name)
    family = plugins.hook().claims(path=path, config=config, options=options)
    if family is None:
        return None
    plugin = plugins.family_provider(family)
    if plugin is None:
        raise plugins.PluginError(f"a plugin claimed {path} for family {family!r}, "
                                  "but no registered plugin provides that family")
    return Claim(family=family, plugin=plugin)


def claim(path: Path, options: LoadOptions) -> LoadedModel:
    """Let the plugins claim ``path``, then have the claimant load it."""
    config = read_json(path / "config.json")
    why = refusal(config)
    if why is not None:  # a known architecture this engine does not serve, and why
        raise NoPluginClaimed(f"{path}: {why}")
    who = identify(path, options, config)
    if who is None:
        raise NoPluginClaimed(
            f"no installed plugin can load {path} (model_type={config.get('model_type')!r}); "
            "`mlxbun plugins` lists what is installed")
    if options.embedding and who.family not in embedding_families():
        raise cannot_embed(path, config, who.family)
    window = plan_window(config, options.context_length)  # refused before the weights load
    if window is not None:
        options.extra["window"] = window
    relay = plugins.relay_for(who.plugin)
    model = relay.load_model(path=path, config=config, options=options)
    if model is None:
        raise plugins.PluginError(f"plugin {who.plugin!r} claimed {path} as {who.family!r} "
                                  "but its load_model returned None")
    if options.embedding and model.kind != "embedding":
        raise cannot_embed(path, config, who.family)
    model.family, model.plugin = who.family, who.plugin  # model.hooks is now ``relay``
    extra = options.extra or {}
    if (extra.get("expert_budget") or extra.get("expert_offload")) \
            and "expert_streaming" not in model.extras:
        from .errors import ExpertsUnsupported

        raise ExpertsUnsupported(f"--expert-offload/--expert-budget: the {who.family} family "
                                 "loads its experts its own way and cannot stream them (the "
                                 "generic mlx-lm loader and glm52 can)")
    if window is not None:
        apply_window(model, window)
    return finish(model)


def plan_window(config: dict, asked: int | None) -> WindowPlan | None:
    """``--context-length`` for this checkpoint; :class:`WindowUnsupported` names the
    checkpoint and says why it cannot be served so."""
    try:
        return window.plan_window(config, asked)
    except window.WindowUnsupported as exc:
        raise window.WindowUnsupported(f"--context-length {asked}: cannot serve "
                                       f"{config.get('model_type', 'this model')!s} so: "
                                       f"{exc}") from None


def apply_window(model: LoadedModel, plan: WindowPlan) -> None:
    """The served window on a loaded model; a stretch its plugin did not build is refused
    (the RoPE would be the trained one, and long prompts would read as noise)."""
    if plan.extended:
        if model.extras.get("rope_scaling") != plan.rope:
            raise window.WindowUnsupported(
                f"--context-length {plan.window}: plugin {model.plugin!r} loads "
                f"{model.family!r} models itself and did not apply the RoPE scaling; "
                f"the window stays {plan.native} (serve without --context-length)")
        model.config = plan.config(model.config)
    model.context_window = plan.window
    model.extras["window"] = plan.report()
def embedding_families() -> dict[str, tuple[str, ...]]:
    """The installed families that embed (their plugin implements ``embed``), each with
    the model types it names (``MODEL_TYPES``, when the plugin has one)."""
    found = {}
    for impl in plugins.pm.hook.embed.get_hookimpls():
        if plugins.is_family(impl.plugin):
            found[plugins.family_name(impl.plugin)] = tuple(
                getattr(impl.plugin, "MODEL_TYPES", ()))
    return found


def cannot_embed(path: Path, config: dict, family: str) -> CannotEmbed:
    """What ``--embedding`` says about a checkpoint its family cannot embed."""
    can = embedding_families()
    what = "; ".join(f"{name} ({', '.join(types)} checkpoints)" if types else name
                     for name, types in sorted(can.items()))
    return CannotEmbed(
        f"--embedding: {path.name} (model_type {config.get('model_type')!r}) is claimed by "
        f"family {family!r}, which cannot embed. "
        + (f"Families that embed: {what}." if can else
           "No installed plugin embeds: pip install mlxbun-qwen3-embed (Qwen3-Embedding)."))


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


def load(name: str | None, options: LoadOptions | None = None, *,
         progress: bool = True) -> LoadedModel:
    """Resolve ``name`` (a query only over ``options.library``), then claim and load it."""
    from .models.resolve import resolve_model

    options = options or LoadOptions()
    resolved = resolve_model(name, library=options.library, progress=progress)
    options.model_id = options.model_id or resolved.model_id
    log.info("loading %s from %s", resolved.model_id, resolved.path)
    return claim(Path(resolved.path), options)
