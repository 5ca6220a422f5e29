"""The served model as clients see it: its ``/v1/models`` row, with the capabilities its
plugins and chat template give it. ``GET /v1/models`` lists it first; the web chat's
``ready`` frame is cut from the same row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..toolcalls.history import supports_tools

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..model import LoadedModel


def media_kinds(engine: Engine) -> set[str]:
    """The media kinds a plugin accepts for the served model (asked through the hook)."""
    m = engine.model
    if m.kind != "generate":
        return set()
    hook = engine.hooks
    return {k for k in ("image", "audio", "video")
            if hook.media_pipeline(model=m, kind=k) is not None}


def template_renders_tools(model: LoadedModel) -> bool:
    """Whether the model's own chat template shows tool definitions to the model.

    (Tools still work with a template that ignores them: the request path then writes
    them into the system turn. This field says which models were made for tools.)
    """
    if model.kind != "generate":
        return False
    template = getattr(model.tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates ("default", "tool_use", ...)
        template = "\n".join(t for t in template.values() if isinstance(t, str))
    return isinstance(template, str) and supports_tools(template)[0]


def model_row(engine: Engine) -> dict[str, Any]:
    """The served model's row: OpenAI's fields, then what it can do (``capabilities``)."""
    m = engine.model
    generate = m.kind == "generate"
    media = media_kinds(engine)
    tools = template_renders_tools(m)
    caps = {"chat_completions": generate, "text_completions": generate,
            "anthropic_messages": generate, "responses": generate, "streaming": generate,
            "tools": tools, "structured_output": generate, "logprobs": generate,
            "embeddings": m.kind == "embedding", "rerank": m.kind == "rerank",
            "transcription": m.kind == "speech",
            "vision": "image" in media,
            "audio": "audio" in media, "video": "video" in media,
            "adapters": generate, "training": generate}
    d = engine.defaults
    window = m.extras.get("window") or {}  # --context-length: the trained window, the RoPE
    return {"id": m.id, "object": "model", "created": engine.started_at, "owned_by": "mlxbun",
            "family": m.family, "plugin": m.plugin, "context_window": m.context_window,
            "native_context_window": window.get("native", m.context_window),
            "rope_scaling": window.get("rope_scaling"),
            "reasoning": m.reasoning, "vision": caps["vision"], "audio": caps["audio"],
            "video": caps["video"], "batch_mode": "batched" if engine.batch > 1 else "serial",
            "tools": tools, "structured_output": generate, "embeddings": caps["embeddings"],
            "adapters": generate, "training": generate, "capabilities": caps,
            "gen_defaults": {**{k: d.get(k) for k in ("temperature", "top_p", "top_k")},
                             "max_tokens": engine.max_tokens}}  # the cap when a request names none
