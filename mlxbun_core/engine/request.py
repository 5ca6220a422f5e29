"""Typed generation requests, and the field validators every surface parses with.

Each surface reads its own body straight into these types: /v1/chat/completions with
:func:`parse_chat`, /v1/completions with :func:`parse_completion`, the Anthropic and
Responses surfaces with their own parsers built from the same validators
(:func:`chat_request`, :func:`boolean_field`, :mod:`.sampling`, the grammar and tool
fields), each told the name the client used, so an error names the field as it was sent.
What comes out is validated (a client mistake is a 400 raised while parsing, before any
model work) and carries nothing protocol-specific.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ..chat_template import check_reasoning_effort
from ..errors import BadRequest
from ..grammar import GrammarRequest, budget_close, resolve_grammar_request
from ..media import parts as media_parts
from ..request_fields import Surface
from ..toolcalls.choice import ToolChoice, check_tools, parse_parallel, parse_tool_choice
from ..toolcalls.history import normalize_history
from .sampling import (
    SamplingParams,
    check_field,
    described,
    max_tokens_from,
    mlx_lm_type_error,
    stop_sequences,
    type_error,
)
from .speculate.config import SpecRequest, speculation_field

MAX_CHOICES = 16  # ``n``: choices per request (each is its own job; OpenAI allows 128)
ROLES = ("system", "developer", "user", "assistant", "tool", "function")  # OpenAI's

@dataclass
class GenerateOptions:
    """What chat and completion requests share."""

    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None  # None: until EOS or the admitted context ends
    stop: list[str] = field(default_factory=list)
    grammar: GrammarRequest | None = None
    budget_close: bool = True  # a constrained reply closes within max_tokens (grammar/budget.py)
    stream: bool = False
    n: int = 1  # choices to generate for the one prompt (see :func:`choice_requests`)
    adapter: str | None = None  # the request's ``adapter`` field, as given
    # the request's ``draft_kind`` / ``num_draft_tokens`` (None: the server's choice)
    speculation: SpecRequest | None = None
    # the surface's own; the engine ignores it
    surface_state: dict[str, Any] = field(default_factory=dict)


@dataclass
class CacheBreakpoint:
    """A prompt prefix a client asked to cache for ``ttl`` seconds (Anthropic's
    ``cache_control``): the request as it would be with a sentinel right after the
    marked block; the prefix is what its rendering shares with the real one."""

    ttl: float
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None


@dataclass
class ChatRequest(GenerateOptions):
    """A chat turn: normalized messages plus everything that shapes the reply."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"  # "auto" | "none" | "required" | "function"
    tool_name: str | None = None  # the forced function when tool_choice == "function"
    parallel_tool_calls: bool = True
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_effort: str | None = None
    # the media parts' references, in document order
    media: list[media_parts.MediaRef] = field(default_factory=list)
    # the same, fetched and decoded (Engine.prepare fills it)
    media_items: list[media_parts.MediaItem] | None = None
    # prefixes to pin in the prefix cache: Anthropic breakpoints, OpenAI's prompt_cache_key
    cache_breakpoints: list[CacheBreakpoint] = field(default_factory=list)
    prompt_cache_key: str | None = None

    @property
    def media_kinds(self) -> tuple[str, ...]:
        """"image" / "audio" / "video" of each media part, in document order."""
        return tuple(ref.kind for ref in self.media)


Prompt = str | list[int]
"""A completion prompt: text, or token ids used as they are."""


@dataclass
class CompletionRequest(GenerateOptions):
    """Raw text completion: no template, no tools. ``prompt`` is the one this request
    runs; ``prompts`` every prompt of the body (each its own choices, see
    :func:`choice_requests`). ``echo``: the prompt comes back in front of the text, its
    tokens scored when log-probs are asked for."""

    prompt: Prompt = ""
    prompts: list[Prompt] = field(default_factory=list)
    echo: bool = False


GenerationInput = ChatRequest | CompletionRequest
SEED_SPACE = 2**64


def choice_requests(req: GenerationInput) -> Iterator[GenerationInput]:
    """One request per choice: every prompt of a completion body in order, ``n`` choices
    each (OpenAI's order: choice ``i`` of prompt ``p`` is index ``p * n + i``)."""
    if isinstance(req, CompletionRequest) and len(req.prompts) > 1:
        for prompt in req.prompts:
            yield from prompt_choices(replace(req, prompt=prompt, prompts=[prompt]))
        return
    yield from prompt_choices(req)


def prompt_choices(req: GenerationInput) -> Iterator[GenerationInput]:
    """``req`` itself, then one copy per further choice of its ``n``.

    Preparing a request adds its grammar processor to the sampling settings, so each
    copy gets settings of its own, taken before the first is prepared. Copies are made
    lazily: media fetched for the first are reused. With a ``seed``, choice ``i`` samples
    with ``seed + i``: the choices differ, and each is repeatable on its own.
    """
    pristine = replace(req.sampling, extra_processors=list(req.sampling.extra_processors))
    yield req
    for i in range(1, req.n):
        seed = None if pristine.seed is None else (pristine.seed + i) % SEED_SPACE
        sampling = replace(pristine, seed=seed, extra_processors=list(pristine.extra_processors))
        yield replace(req, sampling=sampling, surface_state=dict(req.surface_state))


def openai_options(body: dict[str, Any], defaults: dict[str, Any],
             server_max_tokens: int | None, surface: Surface = "chat") -> GenerateOptions:
    """The shared fields of an OpenAI chat or completion body (``surface``)."""
    stream = boolean_field(body.get("stream"), "stream", mlx_lm=True)
    adapter = string_field(body.get("adapter"), "adapter", mlx_lm=True)
    string_field(body.get("model"), "model", mlx_lm=True)  # (one model: routed elsewhere)
    n = body.get("n")
    n = 1 if n is None else check_field("n", n, int, 1, MAX_CHOICES)
    return GenerateOptions(sampling=SamplingParams.from_body(body, defaults, surface),
                           max_tokens=max_tokens_from(body, server_max_tokens),
                           stop=stop_sequences(body), grammar=resolve_grammar_request(body),
                           budget_close=budget_close(body), stream=stream, n=n, adapter=adapter,
                           speculation=speculation_field(body))


def boolean_field(value: object, name: str, default: bool = False,
                  mlx_lm: bool = False) -> bool:
    """A boolean sent as ``name`` (None: ``default``; ``mlx_lm``: a field mlx_lm.server
    checks, whose type error is in its words)."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise mlx_lm_type_error(name, bool) if mlx_lm else type_error(name, "a boolean", value)
    return value


def string_field(value: object, name: str, mlx_lm: bool = False) -> str | None:
    """An optional string sent as ``name`` (``mlx_lm``: as :func:`boolean_field`)."""
    if value is not None and not isinstance(value, str):
        raise mlx_lm_type_error(name, str) if mlx_lm else type_error(name, "a string", value)
    return value


def template_kwargs_field(value: object, name: str = "chat_template_kwargs") -> dict[str, Any]:
    """``chat_template_kwargs``: an object (absent or empty: none)."""
    value = value or {}
    if not isinstance(value, dict):
        raise type_error(name, "an object", value)
    return dict(value)


def parse_chat(body: dict[str, Any], defaults: dict[str, Any] | None = None,
               server_max_tokens: int | None = None) -> ChatRequest:
    """An OpenAI /v1/chat/completions body."""
    messages = body.get("messages")
    if messages is None or messages == []:
        raise BadRequest("messages required: an array of message objects, at least one",
                         param="messages")
    if not isinstance(messages, list):
        raise type_error("messages", "an array of message objects", messages)
    options = openai_options(body, defaults or {}, server_max_tokens)
    tools = check_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = parse_parallel(body.get("parallel_tool_calls"))
    kwargs = template_kwargs_field(body.get("chat_template_kwargs"))
    effort = check_reasoning_effort(body.get("reasoning_effort"))
    typed = chat_request(options, messages, tools=tools, choice=choice, parallel=parallel,
                         template_kwargs=kwargs, reasoning_effort=effort)
    # pins the prompt in the prefix cache (engine/cache_pins.py)
    typed.prompt_cache_key = string_field(body.get("prompt_cache_key"), "prompt_cache_key")
    return typed


def chat_request(options: GenerateOptions, messages: list[Any], *,
                 tools: list[dict[str, Any]] | None = None,
                 choice: ToolChoice = ToolChoice(), parallel: bool = True,
                 template_kwargs: dict[str, Any] | None = None, reasoning_effort: str | None = None,
                 name: str = "messages") -> ChatRequest:
    """The typed chat request every chat surface ends in, from its checked parts and its
    messages in the chat shape (normalized here; errors name them ``name``). Tools are
    dropped under ``tool_choice`` none."""
    media: list[media_parts.MediaRef] = []
    msgs = normalize_history([normalize_message(m, media, i, name) for i, m in enumerate(messages)],
                             param=name)
    return ChatRequest(messages=msgs, tools=None if choice.mode == "none" else tools,
                       tool_choice=choice.mode, tool_name=choice.name,
                       parallel_tool_calls=parallel, template_kwargs=dict(template_kwargs or {}),
                       reasoning_effort=reasoning_effort, media=media, **shared_fields(options))


def shared_fields(options: GenerateOptions) -> dict[str, Any]:
    """``options`` as keyword arguments of a request type (its fields, not copies)."""
    return {f.name: getattr(options, f.name) for f in fields(GenerateOptions)}


def check_role(m: object, index: int, name: str = "messages") -> None:
    """A message is an object whose role is one OpenAI accepts (400 naming the position)."""
    where = f"{name}[{index}]"
    if not isinstance(m, dict):
        raise type_error(where, "a message object with a role", m, param=name)
    role = m.get("role")
    if role is None:
        raise BadRequest(f"{where}.role is required", param=f"{where}.role")
    if role not in ROLES:
        allowed = ", ".join(repr(r) for r in ROLES)
        shown = repr(role) if isinstance(role, str) else described(role)
        raise BadRequest(f"{where}.role must be one of {allowed} (got {shown})",
                         param=f"{where}.role", code="invalid_value")


def normalize_message(m: Any, media: list[media_parts.MediaRef], index: int = 0,
                      name: str = "messages") -> dict[str, Any]:
    """One history message as every chat template can read it.

    ``developer`` renders as ``system``; ``reasoning`` is an alias of
    ``reasoning_content``; text parts are joined; with media parts the content
    stays a part list whose media parts are ``{"type": kind}`` placeholders, and
    their references are appended to ``media`` (document order). Errors name the
    message list ``name`` (Responses calls it ``input``).
    """
    check_role(m, index, name)
    msg: dict[str, Any] = dict(m)
    if msg["role"] == "developer":  # OpenAI's newer name for system; templates know "system"
        msg["role"] = "system"
    if (msg["role"] == "assistant" and not isinstance(msg.get("reasoning_content"), str)
            and isinstance(msg.get("reasoning"), str)):
        msg["reasoning_content"] = msg["reasoning"]
    content = msg.get("content")
    if isinstance(content, list):
        msg["content"], refs = media_parts.split_content(content, param=name)
        media += refs
    elif content is not None and not isinstance(content, str):
        raise type_error(f"{name}[{index}].content", "a string or an array of parts", content,
                         param=name)
    return msg
