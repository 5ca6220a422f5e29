"""The generic family: any architecture mlx-lm can load.

Registered last (``trylast``) so every family plugin gets the first word. Uses the
checkpoint's own chat template and mlx-lm's tool-parser inference.
"""

from __future__ import annotations

from mlxbun_core import toolcalls
from mlxbun_core.chat_template import apply_template, thinking_switch
from mlxbun_core.hookspecs import hookimpl
from mlxbun_core.model import LoadedModel, Prompt

FAMILY = "generic"


def mlx_lm_supports(model_type) -> bool:
    """Whether mlx-lm ships a model definition for ``model_type``."""
    import importlib.util

    from mlx_lm.utils import MODEL_REMAPPING

    if not model_type:
        return False
    name = MODEL_REMAPPING.get(model_type, model_type).replace("-", "_")
    return importlib.util.find_spec(f"mlx_lm.models.{name}") is not None


@hookimpl(trylast=True)
def load_model(path, config, options):
    from mlx_lm.utils import load

    if not mlx_lm_supports(config.get("model_type")):
        return None
    model, tokenizer = load(str(path))
    return LoadedModel(id=options.model_id, path=path, config=config, model=model,
                       tokenizer=tokenizer, family=FAMILY,
                       reasoning=bool(getattr(tokenizer, "has_thinking", False)))


@hookimpl(trylast=True)
def render_chat(model, messages, tools, template_kwargs, reasoning_effort):
    if not getattr(model.tokenizer, "has_chat_template", True):
        return plain_chat(model, messages)
    kwargs = dict(template_kwargs)
    enabled = thinking_switch(kwargs, reasoning_effort, None)
    if enabled is not None:
        kwargs["enable_thinking"] = enabled
    return apply_template(model, messages, tools, kwargs)


@hookimpl(trylast=True)
def tool_call_parser(model, tools):
    dialect = toolcalls.dialect_for_tokenizer(model.tokenizer)
    return toolcalls.StreamingToolParser(dialect or toolcalls.JsonDialect(), tools)


def plain_chat(model, messages):
    """Base models ship no chat template: mlx_lm.server's plain "USER: …" transcript."""
    from mlx_lm.server import convert_chat

    text = convert_chat([{"role": m["role"], "content": m.get("content") or ""} for m in messages])
    return Prompt(tokens=model.tokenizer.encode(text), text=text)
