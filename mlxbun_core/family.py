"""What most family plugins share: a claim by ``model_type`` or architecture, and a load
through mlx-lm with the family's chat template for checkpoints that ship none.

A family whose forward pass is mlx-lm's own needs little more than::

    MINE = Family("myfamily", model_types=("myarch",), architectures=("MyArchForCausalLM",))

    @hookimpl
    def claims(config):
        return MINE.claim(config)

    @hookimpl
    def load_model(path, config, options):
        return load_mlx_lm(path, config, options, template=packaged_template(__name__),
                           reasoning=True)

Nothing here imports mlx-lm until a model is loaded, so claiming stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from .chat_template import install_fallback_template
from .model import LoadedModel


@dataclass(frozen=True)
class Family:
    """A family told apart by its config alone: ``model_type`` (or, for multimodal
    checkpoints, ``text_config.model_type``) or one of its ``architectures``."""

    name: str
    model_types: tuple[str, ...] = ()
    architectures: tuple[str, ...] = ()
    text_model_types: tuple[str, ...] = ()

    def matches(self, config: dict) -> bool:
        if config.get("model_type") in self.model_types:
            return True
        if any(a in self.architectures for a in config.get("architectures") or ()):
            return True
        text = config.get("text_config") or {}
        return (bool(self.text_model_types) and isinstance(text, dict)
                and text.get("model_type") in self.text_model_types)

    def claim(self, config: dict) -> str | None:
        """The ``claims`` answer: the family's name when ``config`` is one of its own."""
        return self.name if self.matches(config) else None


def packaged_template(package: str, name: str = "template.jinja") -> str:
    """A chat template shipped inside ``package`` (a plugin's ``__name__``)."""
    return files(package).joinpath(name).read_text(encoding="utf-8")


def load_mlx_lm(path, config: dict, options, *, template: str | None = None,
                stop_tokens: tuple[str, ...] = (), reasoning: bool | None = False,
                lazy_transform: Callable[[Any], None] | None = None, **fields) -> LoadedModel:
    """Load the checkpoint at ``path`` with mlx-lm's own model and tokenizer.

    ``template``: the family's chat template, installed when the checkpoint ships none
    (``extras["fallback_template"]`` says whether it was). ``stop_tokens``: tokens that
    end a turn besides the checkpoint's EOS, where the vocabulary has them.
    ``reasoning``: whether the model has a switchable thinking channel (None: what the
    tokenizer says, mlx-lm's ``has_thinking``).
    ``lazy_transform``: called with the lazily loaded module before any weight is read
    (a plugin that streams some tensors later drops them here, so they are never loaded).
    ``fields``: any other :class:`LoadedModel` field (``generation_defaults``, ``kind``).
    """
    from mlx_lm.utils import load

    plan = getattr(options, "shard", None)
    window = getattr(options, "extra", {}).get("window")  # --context-length (models.window)
    overrides = window.overrides if window is not None and window.extended else None
    # (model, tokenizer): mlx-lm types the 3-tuple of return_config too
    lazy = plan is not None or lazy_transform is not None
    loaded = load(str(path), lazy=lazy, model_config=overrides)
    model, tokenizer = loaded[0], loaded[1]
    if lazy_transform is not None:
        lazy_transform(model)
    if plan is not None:  # --distributed: only this rank's shard is read from disk
        plan.apply(model)
    if lazy:
        import mlx.core as mx

        mx.eval(model.parameters())
    if template is not None:
        fallback = install_fallback_template(tokenizer, template)
        fields["extras"] = {**fields.get("extras", {}), "fallback_template": fallback}
    if stop_tokens:
        vocab = tokenizer.get_vocab()
        for tok in stop_tokens:
            if tok in vocab:
                tokenizer.add_eos_token(tok)
    if reasoning is None:
        reasoning = bool(getattr(tokenizer, "has_thinking", False))
    if window is not None and overrides is not None:  # the loader checks it was built
        fields["extras"] = {**fields.get("extras", {}), "rope_scaling": window.rope}
    return LoadedModel(id=options.model_id, path=Path(path), config=config, model=model,
                       tokenizer=tokenizer, reasoning=reasoning, **fields)
