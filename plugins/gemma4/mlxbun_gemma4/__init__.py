"""Gemma 4 for mlxbun: claim, chat format, thinking switch and tool calls.

The forward pass is mlx-lm's (``gemma4`` / ``gemma4_text``); what lives here is what
makes Gemma 4 different from the generic family:

* turns are ``<|turn>ROLE … <turn|>``; thinking is switched on by a ``<|think|>``
  token at the top of the system turn, and with thinking off the generation prompt
  carries an empty ``<|channel>thought\\n<channel|>`` so the model answers directly;
* the thought channel ``<|channel>thought … <channel|>`` is routed to ``reasoning``;
* tool calls are ``<|tool_call>call:name{k:<|"|>v<|"|>}<tool_call|>`` (see toolcalls.py),
  and the model hands a turn over to the tool runner with ``<|tool_response>``.
"""

from __future__ import annotations

from mlxbun_core.chat_template import apply_template, opens_thinking, thinking_switch
from mlxbun_core.family import Family, load_mlx_lm, packaged_template
from mlxbun_core.hookspecs import hookimpl
from mlxbun_core.toolcalls import StreamingToolParser

from .toolcalls import Gemma4Dialect

__version__ = "0.1.0"

FAMILY = "gemma4"
MODEL_TYPES = ("gemma4", "gemma4_text")
ARCHITECTURES = ("Gemma4ForConditionalGeneration", "Gemma4ForCausalLM")
GEMMA4 = Family(FAMILY, MODEL_TYPES, ARCHITECTURES)
THINK_START, THINK_END = "<|channel>thought", "<channel|>"
# Google's recommended sampling for Gemma 4; the checkpoint's generation_config.json wins
# (the loader merges it over these).
SAMPLING_DEFAULTS = {"temperature": 1.0, "top_p": 0.95, "top_k": 64}
# Published Gemma 4 checkpoints stop on these (generation_config eos_token_id).
STOP_TOKENS = ("<eos>", "<turn|>", "<|tool_response>")


def fallback_template() -> str:
    return packaged_template(__name__)


@hookimpl
def claims(config):
    return GEMMA4.claim(config)


@hookimpl
def load_model(path, config, options):
    return load_mlx_lm(path, config, options, template=fallback_template(),
                       stop_tokens=STOP_TOKENS, reasoning=True,
                       generation_defaults=dict(SAMPLING_DEFAULTS))


def _canonical(m: dict) -> dict:
    """Templates written for Gemma read ``reasoning`` before ``reasoning_content``;
    the canonical field (already set from the alias by the engine) must win, even empty."""
    if (m.get("role") == "assistant" and isinstance(m.get("reasoning_content"), str)
            and "reasoning" in m):
        m = dict(m)
        del m["reasoning"]
    return m


@hookimpl
def render_chat(model, messages, tools, template_kwargs, reasoning_effort):
    kwargs = dict(template_kwargs)
    kwargs["enable_thinking"] = bool(thinking_switch(kwargs, reasoning_effort, False))
    prompt = apply_template(model, [_canonical(m) for m in messages], tools, kwargs)
    prompt.think_start, prompt.think_end = THINK_START, THINK_END
    prompt.in_reasoning = opens_thinking(prompt.text, THINK_START, THINK_END)
    return prompt


@hookimpl
def tool_call_parser(model, tools):
    return StreamingToolParser(Gemma4Dialect(), tools)


@hookimpl
def media_pipeline(model, kind):
    """Images through the vision tower; audio where the checkpoint has an audio tower
    (e2b/e4b). Video is not served for Gemma 4."""
    from mlxbun_core.plugins_builtin.vlm import pipeline_for

    return pipeline_for(model, kind, allowed=("image", "audio"))
