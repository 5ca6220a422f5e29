"""A third-party family in one module: the smallest complete mlxbun plugin.

It claims any checkpoint whose config.json lists ``"EchoLlamaForCausalLM"`` in
``architectures`` (a llama under its own name), loads it with mlx-lm, renders chat
with a plain "User:/Assistant:" transcript and reads tool calls written as
``CALL name {json arguments}`` lines. Nothing in mlxbun's core knows it exists; the
entry point in pyproject.toml is the whole integration.

mlxbun asks ``render_chat`` and ``tool_call_parser`` only for models this plugin
claimed, so none of them checks which model it was handed.
"""

from __future__ import annotations

import json

from mlxbun_core import hookimpl
from mlxbun_core.family import load_mlx_lm
from mlxbun_core.model import LoadedModel, Prompt
from mlxbun_core.toolcalls import Dialect, StreamingToolParser, make_call

FAMILY = "echo"  # what claims() answers; mlxbun routes this family's models here


@hookimpl
def claims(config: dict) -> str | None:
    """Cheap: config.json only, no weights, no heavy imports."""
    return FAMILY if "EchoLlamaForCausalLM" in config.get("architectures", []) else None


@hookimpl
def load_model(path, config, options) -> LoadedModel:
    """mlx-lm's own model and tokenizer (mlx-lm is imported now, never at claim time)."""
    return load_mlx_lm(path, config, options)


@hookimpl
def render_chat(model, messages, tools) -> Prompt:
    lines = []
    if tools:
        names = ", ".join(t["function"]["name"] for t in tools)
        lines.append(f"System: to use a tool ({names}) write CALL name {{json arguments}}")
    lines += [f"{m['role'].title()}: {m.get('content') or ''}" for m in messages]
    text = "\n".join(lines) + "\nAssistant:"
    return Prompt(tokens=model.tokenizer.encode(text), text=text)


class EchoDialect(Dialect):
    """``CALL name {"arg": 1}`` up to the end of the line."""

    starts = ("CALL ",)
    end = "\n"

    def parse(self, markup, tools):
        name, _, args = self.inner(markup).strip().partition(" ")
        try:
            args = json.loads(args or "{}")
        except ValueError:
            return None  # not a call after all: the text streams as content
        if not name or not isinstance(args, dict):
            return None
        return [make_call(name, args, tools)]  # coerces arguments to the tool's schema


@hookimpl
def tool_call_parser(tools) -> StreamingToolParser:
    return StreamingToolParser(EchoDialect(), tools)
