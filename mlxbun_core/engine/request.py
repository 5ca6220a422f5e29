"""Typed generation requests, parsed from the OpenAI request bodies.

Every surface ends here: /v1/chat/completions hands its body to
:func:`parse_chat`, the Anthropic and Responses surfaces first translate theirs
into the OpenAI chat shape, /v1/completions uses :func:`parse_completion`. What
comes out is validated (a client mistake is a 400 raised here, before any model
work) and carries nothing protocol-specific.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from ..chat_template import check_reasoning_effort
from ..errors import BadRequest
from ..grammar import GrammarRequest, budget_close, resolve_grammar_request
from ..media import parts as media_parts
from ..toolcalls.choice import check_tools, parse_parallel, parse_tool_choice
from ..toolcalls.history import normalize_history
from .sampling import SamplingParams, max_tokens_from, stop_sequences

@dataclass
class GenerateOptions:
    """What chat and completion requests share."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: Optional[int] = None  # None: until EOS or the admitted context ends
    stop: list = field(default_factory=list)
    grammar: Optional[GrammarRequest] = None
    budget_close: bool = True  # a constrained reply closes within max_tokens (grammar/budget.py)
    stream: bool = False
    adapter: Optional[str] = None  # the request's ``adapter`` field, as given
    surface_state: dict = field(default_factory=dict)  # the surface's own; the engine ignores it


@dataclass
class ChatRequest(GenerateOptions):
    """A chat turn: normalized messages plus everything that shapes the reply."""

    messages: list = field(default_factory=list)
    tools: Optional[list] = None
    tool_choice: str = "auto"  # "auto" | "none" | "required" | "function"
    tool_name: Optional[str] = None  # the forced function when tool_choice == "function"
    parallel_tool_calls: bool = True
    template_kwargs: dict = field(default_factory=dict)
    reasoning_effort: Optional[str] = None
    media: list = field(default_factory=list)  # MediaRefs of the media parts, in document order
    media_items: Optional[list] = None  # the same, fetched and decoded (Engine.prepare fills it)

    @property
    def media_kinds(self) -> tuple:
        """"image" / "audio" / "video" of each media part, in document order."""
        return tuple(ref.kind for ref in self.media)


@dataclass
class CompletionRequest(GenerateOptions):
    """Raw text completion: no template, no tools."""

    prompt: str = ""


GenerationInput = Union[ChatRequest, CompletionRequest]


def _options(body: dict, defaults: dict, server_max_tokens: Optional[int]) -> dict:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise BadRequest("stream must be of type bool", param="stream")
    adapter = body.get("adapter")
    if adapter is not None and not isinstance(adapter, str):
        raise BadRequest("adapter must be a string", param="adapter")
    return {"sampling": SamplingParams.from_body(body, defaults),
            "max_tokens": max_tokens_from(body, server_max_tokens),
            "stop": stop_sequences(body), "grammar": resolve_grammar_request(body),
            "budget_close": budget_close(body),
            "stream": stream, "adapter": adapter}


def parse_completion(body: dict, defaults: Optional[dict] = None,
                     server_max_tokens: Optional[int] = None) -> CompletionRequest:
    text = body.get("prompt")
    if not isinstance(text, str) or not text:
        raise BadRequest("prompt must be a non-empty string", param="prompt")
    return CompletionRequest(prompt=text, **_options(body, defaults or {}, server_max_tokens))


def parse_chat(body: dict, defaults: Optional[dict] = None,
               server_max_tokens: Optional[int] = None) -> ChatRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages required", param="messages")
    options = _options(body, defaults or {}, server_max_tokens)
    tools = check_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = parse_parallel(body.get("parallel_tool_calls"))
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object", param="chat_template_kwargs")
    effort = check_reasoning_effort(body.get("reasoning_effort"))
    media: list = []
    msgs = normalize_history([normalize_message(m, media) for m in messages])
    if choice.mode == "none":
        tools = None
    return ChatRequest(messages=msgs, tools=tools, tool_choice=choice.mode, tool_name=choice.name,
                       parallel_tool_calls=parallel, template_kwargs=dict(kwargs),
                       reasoning_effort=effort, media=media, **options)


def normalize_message(m, media: list) -> dict:
    """One history message as every chat template can read it.

    ``developer`` renders as ``system``; ``reasoning`` is an alias of
    ``reasoning_content``; text parts are joined; with media parts the content
    stays a part list whose media parts are ``{"type": kind}`` placeholders, and
    their references are appended to ``media`` (document order).
    """
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise BadRequest("each message must be an object with a string role", param="messages")
    m = dict(m)
    if m["role"] == "developer":  # OpenAI's newer name for system; templates know "system"
        m["role"] = "system"
    if m["role"] == "assistant":
        if not isinstance(m.get("reasoning_content"), str) and isinstance(m.get("reasoning"), str):
            m["reasoning_content"] = m["reasoning"]
    content = m.get("content")
    if isinstance(content, list):
        m["content"], refs = media_parts.split_content(content)
        media += refs
    elif content is not None and not isinstance(content, str):
        raise BadRequest("message content must be a string or an array of parts", param="messages")
    return m
