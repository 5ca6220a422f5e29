"""The generic family: any architecture mlx-lm can load.

Answers last (``trylast``): it claims whatever no family plugin claimed, and is
the fallback for every per-model hook a family leaves unanswered. Uses the
checkpoint's own chat template and mlx-lm's tool-parser inference.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

from mlxbun_core import toolcalls
from mlxbun_core.chat_template import apply_template, thinking_switch
from mlxbun_core.family import load_mlx_lm
from mlxbun_core.hookspecs import hookimpl
from mlxbun_core.model import Prompt

FAMILY = "generic"


def mlx_lm_supports(model_type) -> bool:
    """Whether mlx-lm ships a model definition for ``model_type``, found on disk
    without importing mlx-lm (which pulls in transformers: seconds, not micros)."""
    if not model_type or not isinstance(model_type, str):
        return False
    name = _model_remapping().get(model_type, model_type).replace("-", "_")
    models = _mlx_lm_dir() / "models"
    return (models / f"{name}.py").is_file() or (models / name / "__init__.py").is_file()


@lru_cache(maxsize=1)
def _mlx_lm_dir() -> Path:
    spec = importlib.util.find_spec("mlx_lm")  # locates the package, runs nothing
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("mlx_lm")
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=1)
def _model_remapping() -> dict:
    """mlx-lm's ``MODEL_REMAPPING`` (model_type aliases such as mistral -> llama),
    read from its source when mlx_lm.utils is not imported yet."""
    utils = sys.modules.get("mlx_lm.utils")
    if utils is not None:
        return dict(utils.MODEL_REMAPPING)
    tree = ast.parse((_mlx_lm_dir() / "utils.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and getattr(node.targets[0], "id", None) == "MODEL_REMAPPING"):
            return ast.literal_eval(node.value)
    from mlx_lm.utils import MODEL_REMAPPING  # layout changed: pay for the import

    return dict(MODEL_REMAPPING)


@hookimpl(trylast=True)
def claims(config):
    return FAMILY if mlx_lm_supports(config.get("model_type")) else None


@hookimpl(trylast=True)
def load_model(path, config, options):
    from ..experts.streaming import asked, load_streamed

    budget = asked(options)
    if budget is not None:  # a MoE's routed experts stay on disk (--expert-offload)
        return load_streamed(path, config, options, budget, reasoning=None)
    return load_mlx_lm(path, config, options, reasoning=None)  # thinking: as the tokenizer says


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


@hookimpl(trylast=True)
def media_pipeline(model, kind):
    """Images (and audio, where the checkpoint ships an audio tower) through mlx-vlm
    for any architecture it knows; video is a Qwen3.5 feature (its family plugin)."""
    from .vlm import pipeline_for

    return pipeline_for(model, kind, allowed=("image", "audio"))


def plain_chat(model, messages):
    """Base models ship no chat template: mlx_lm.server's plain "USER: …" transcript."""
    from mlx_lm.server import convert_chat

    text = convert_chat([{"role": m["role"], "content": m.get("content") or ""} for m in messages])
    return Prompt(tokens=model.tokenizer.encode(text), text=text)
