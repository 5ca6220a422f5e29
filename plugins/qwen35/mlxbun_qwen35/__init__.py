"""mlxbun-qwen35: the Qwen3.5 family (dense ``qwen3_5`` and MoE ``qwen3_5_moe``).

What differs from the generic plugin:
- thinking is on by default (as in the published template); ``reasoning_effort``
  "none" turns it off, any other level on; an explicit ``enable_thinking`` wins;
- a Qwen3.5 chat template ships with the plugin for checkpoints that lack one;
- tool calls use the Qwen XML dialect (``<tool_call><function=…><parameter=…>``).
The forward pass is mlx-lm's own ``qwen3_5`` / ``qwen3_5_moe`` model.
"""

from __future__ import annotations

from mlxbun_core.chat_template import apply_template, thinking_switch
from mlxbun_core.family import Family, load_mlx_lm, packaged_template
from mlxbun_core.hookspecs import hookimpl

from .toolcalls import make_parser

FAMILY = "qwen35"
MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                 "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM")
QWEN35 = Family(FAMILY, MODEL_TYPES, ARCHITECTURES,
                 text_model_types=("qwen3_5_text", "qwen3_5_moe_text"))
THINK_START, THINK_END = "<think>", "</think>"


def fallback_template() -> str:
    return packaged_template(__name__)


def is_qwen35(config: dict) -> bool:
    return QWEN35.matches(config)


@hookimpl
def claims(config):
    return QWEN35.claim(config)


@hookimpl
def load_model(path, config, options):
    return load_mlx_lm(path, config, options, template=fallback_template(), reasoning=True)


@hookimpl
def render_chat(model, messages, tools, template_kwargs, reasoning_effort):
    kwargs = dict(template_kwargs)
    kwargs["enable_thinking"] = thinking_switch(kwargs, reasoning_effort, True)
    prompt = apply_template(model, messages, tools, kwargs)
    prompt.think_start, prompt.think_end = THINK_START, THINK_END
    prompt.in_reasoning = prompt.text.endswith(THINK_START + "\n")
    return prompt


@hookimpl
def tool_call_parser(model, tools):
    return make_parser(tools)


@hookimpl
def media_pipeline(model, kind):
    """Images and video (frames through the same vision tower) via mlx-vlm."""
    from mlxbun_core.plugins_builtin.vlm import pipeline_for

    return pipeline_for(model, kind, allowed=("image", "video"))


@hookimpl
def token_predictor(model):
    """The checkpoint's ``mtp.*`` head, when it ships one (``mtp.py``)."""
    from .mtp import load_predictor

    return load_predictor(model)
