"""mlxbun-minicpm5: OpenBMB's MiniCPM5.

MiniCPM5 checkpoints ship as a plain ``LlamaForCausalLM`` (``model_type: llama``), so
model_type alone cannot tell them from any Llama. This plugin claims a ``llama``
checkpoint only when a MiniCPM5 signal is present as well:

* its chat template (``tokenizer_config.json`` or ``chat_template.jinja``) uses
  MiniCPM5's tool-call markup, ``<function name=`` together with ``<param name=``
  (the same markers mlx-lm uses to pick its ``minicpm5`` tool parser); or
* the model id or checkpoint directory name says ``minicpm5`` / ``MiniCPM-5``.

A Llama checkpoint with neither falls through to the generic plugin. The forward pass
is mlx-lm's ``llama``; what this plugin adds is the thinking default (**off**: direct
answers unless ``enable_thinking: true`` or a ``reasoning_effort`` other than
``"none"``), a fallback chat template and the ``<function name="…"><param name="…">``
tool-call parser.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from mlxbun_core.chat_template import apply_template, thinking_switch
from mlxbun_core.family import load_mlx_lm, packaged_template
from mlxbun_core.hookspecs import hookimpl

from .toolcalls import MiniCPM5Dialect, make_parser

__all__ = ["FAMILY", "MiniCPM5Dialect", "claims", "is_minicpm5", "load_model", "render_chat",
           "tool_call_parser"]

FAMILY = "minicpm5"
_NAME = re.compile(r"minicpm[-_ ]?5", re.I)
_MARKERS = ("<function name=", "<param name=")


def fallback_template() -> str:
    return packaged_template(__name__)


def _read_json(p: Path) -> dict:
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def checkpoint_template(path: Path) -> str:
    """The chat template text a checkpoint ships (all named variants joined)."""
    tpl = _read_json(path / "tokenizer_config.json").get("chat_template") or ""
    if isinstance(tpl, list):  # [{"name": ..., "template": ...}, ...]
        tpl = "\n".join(t.get("template", "") for t in tpl if isinstance(t, dict))
    side = path / "chat_template.jinja"
    if side.is_file():
        tpl += "\n" + side.read_text(encoding="utf-8")
    return tpl if isinstance(tpl, str) else ""


def is_minicpm5(path, config: dict, model_id: str = "") -> bool:
    """model_type minicpm5, or a llama checkpoint with a MiniCPM5 name or template."""
    if config.get("model_type") == "minicpm5":
        return True
    if config.get("model_type") != "llama":
        return False
    path = Path(path)
    if any(_NAME.search(n or "") for n in (model_id, path.name)):
        return True
    tpl = checkpoint_template(path)
    return all(m in tpl for m in _MARKERS)


@hookimpl
def claims(path, config, options):
    return FAMILY if is_minicpm5(path, config, options.model_id) else None


@hookimpl
def load_model(path, config, options):
    return load_mlx_lm(path, config, options, template=fallback_template(), reasoning=True)


@hookimpl
def render_chat(model, messages, tools, template_kwargs, reasoning_effort):
    thinking = bool(thinking_switch(template_kwargs, reasoning_effort, False))  # no-think default
    return apply_template(model, messages, tools, dict(template_kwargs, enable_thinking=thinking))


@hookimpl
def tool_call_parser(model, tools):
    return make_parser(tools)
