"""From a typed request to a model-ready one: prompt tokens, sampler, processors.

Everything model-specific goes through the per-model hooks (template, tool
parser, media); the grammar registry compiles constraints. Runs off the event
loop (templates and grammar compiles can take hundreds of ms), one at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..contract import MediaPipeline, Tokenizer, ToolParser
from ..errors import APIError, BadRequest
from ..grammar import GrammarPlan
from ..grammar_registry import registry as grammars
from ..media import parts as media_parts
from ..model import LoadedModel, MediaPrompt
from ..runconfig import current
from ..sequences import common_prefix
from ..toolcalls import ToolChoice, plan_constraint
from .cache_pins import KEY_TTL, Pin
from .request import ChatRequest, CompletionRequest, GenerationInput
from .session import GenerationRequest

if TYPE_CHECKING:
    from ..plugins import ModelHooks


@dataclass
class Prepared:
    """A request ready to queue, plus what the surface needs to answer it."""

    request: GenerationRequest
    warning: str | None = None  # the Warning header: a constraint that is not enforced


def vocab_size(model: LoadedModel) -> int:
    """Rows of the output layer (can exceed the tokenizer's size)."""
    cfg = model.config
    return int(cfg.get("vocab_size") or cfg.get("text_config", {}).get("vocab_size")
               or len(model.tokenizer))


NOT_GENERATIVE = {"embedding": ("an embedding model", "/v1/embeddings"),
                  "rerank": ("a reranker", "/v1/rerank"),
                  "speech": ("a speech model", "/v1/audio/transcriptions")}
"""What a model of another kind is called, and the route it serves."""


def prepare(model: LoadedModel, hooks: ModelHooks, req: GenerationInput, *,
            compile_grammar: bool = True) -> Prepared:
    """Render / tokenize ``req`` for ``model``; 400 for anything the model refuses."""
    if model.kind != "generate":
        what, route = NOT_GENERATIVE.get(model.kind, NOT_GENERATIVE["embedding"])
        raise BadRequest(f"model {model.id} is {what}: it serves POST {route} only",
                         param="model")
    if isinstance(req, CompletionRequest):
        grammar = req.grammar if compile_grammar else None
        plan = grammars.plan_request(grammar, model.tokenizer) if grammar else GrammarPlan()
        gen = _completion(model, req)
    else:
        parser = hooks.tool_call_parser(model=model, tools=req.tools) if req.tools else None
        plan = (plan_constraint(parser, req.tools, ToolChoice(req.tool_choice, req.tool_name),
                                req.parallel_tool_calls, req.grammar, model.tokenizer)
                if compile_grammar else GrammarPlan())
        gen, rendered = _chat(model, hooks, req, plan, parser)
        if compile_grammar:  # (counting tokens pins nothing)
            gen.cache_pins = cache_pins(model, hooks, req, plan, gen, rendered)
    if plan.processor is not None:
        gen.sampling.extra_processors.append(plan.processor)  # last: after bias/penalties
        gen.grammar = plan.processor
        plan.processor.close_on_budget = req.budget_close
    if plan.whole_reply:  # the grammar ends the reply: no stop string cuts into it, and
        gen.stop = []     # think markers inside it are text (only an opened channel is not)
        gen.think_start = None
    if compile_grammar:  # counting tokens needs no sampler
        _sampler(model, gen)
        if gen.grammar is not None:  # the budget's guard draws as the request would
            gen.grammar.sampler = gen.sampler
    return Prepared(gen, warning=plan.warning)


def _completion(model: LoadedModel, req: CompletionRequest) -> GenerationRequest:
    if isinstance(req.prompt, str):
        tokens = encode_prompt(model.tokenizer, req.prompt)
        if not tokens:
            raise BadRequest("prompt encodes to no tokens", param="prompt")
    else:  # token ids, as they are (no BOS added)
        tokens = list(req.prompt)
        size = vocab_size(model)
        bad = next((t for t in tokens if t >= size), None)
        if bad is not None:
            raise BadRequest(f"prompt token id {bad} is outside the vocabulary "
                             f"(0..{size - 1})", param="prompt", code="invalid_value")
    # no template to inject an instruction into: the degrade path is the Warning alone
    return GenerationRequest(prompt_tokens=tokens, sampling=req.sampling,
                             max_tokens=req.max_tokens, stop=req.stop,
                             score_prompt=req.echo and req.sampling.wants_logprobs)


def encode_prompt(tokenizer: Tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """``text`` as prompt tokens, with the tokenizer's special tokens (its BOS) unless told
    not to; a text that already starts with the BOS token's own text keeps that one only,
    so a client that tokenized with the BOS and sends the text back is scored on the same
    tokens (lm-eval with ``tokenized_requests`` off and ``add_bos_token``)."""
    tokens: list[int] = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    bos, bos_id = getattr(tokenizer, "bos_token", None), getattr(tokenizer, "bos_token_id", None)
    if (add_special_tokens and isinstance(bos, str) and bos and text.startswith(bos)
            and tokens[:2] == [bos_id, bos_id]):
        return tokens[1:]
    return tokens


def template_kwargs_of(req: ChatRequest) -> dict[str, Any]:
    """The template kwargs a chat request renders with: its ``chat_template_kwargs``, plus
    its ``reasoning_effort`` as that kwarg for templates that take a depth (gpt-oss,
    Qwen3.8; ``chat_template_kwargs``' own wins, templates that read none ignore it), plus
    ``serve --thinking`` as ``enable_thinking`` when the request sets neither it nor an
    effort (which then decide)."""
    kwargs = dict(req.template_kwargs)
    if req.reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", req.reasoning_effort)
    default = current().engine.thinking
    if default is not None and "enable_thinking" not in kwargs \
            and req.reasoning_effort is None:
        kwargs["enable_thinking"] = default
    return kwargs


def _chat(model: LoadedModel, hooks: ModelHooks, req: ChatRequest, plan: GrammarPlan,
          parser: ToolParser | None) -> tuple[GenerationRequest, list[int]]:
    """The request to generate, and the template's rendering (before any media
    expansion)."""
    pipeline = media_pipeline(model, hooks, req.media_kinds) if req.media else None
    msgs = req.messages
    if plan.instruction:  # degrade path: ask in words for what we cannot enforce
        msgs = with_instruction(msgs, plan.instruction)
    prompt = hooks.render_chat(model=model, messages=msgs, tools=req.tools,
                               template_kwargs=template_kwargs_of(req),
                               reasoning_effort=req.reasoning_effort)
    if prompt is None:
        raise APIError(f"no plugin can render a chat prompt for {model.id}")
    gen = GenerationRequest(prompt_tokens=list(prompt.tokens), sampling=req.sampling,
                            max_tokens=req.max_tokens, stop=req.stop,
                            think_start=prompt.think_start, think_end=prompt.think_end,
                            in_reasoning=prompt.in_reasoning, tool_parser=parser)
    if pipeline is not None:  # media: the pipeline expands the placeholders and runs the model
        items = req.media_items
        if items is None:  # a synchronous caller (Engine.prepare loads them on the loop)
            items = asyncio.run(media_parts.load(req.media))
        gen.media = pipeline.prepare(prompt, items)
        gen.prompt_tokens = list(gen.media.tokens)
    if plan.processor is not None and prompt.in_reasoning and prompt.think_end:
        # the model thinks freely first; the constraint applies to the answer
        plan.processor.start_after(
            model.tokenizer.encode(prompt.think_end, add_special_tokens=False))
    return gen, list(prompt.tokens)


def cache_pins(model: LoadedModel, hooks: ModelHooks, req: ChatRequest, plan: GrammarPlan,
               gen: GenerationRequest, rendered: list[int]) -> list[Pin]:
    """The prompt prefixes ``req`` asks the prefix cache to pin: each breakpoint's, the
    tokens its sentinel variant's rendering shares with ``rendered`` (the prompt before
    media expansion; with media, carried past it: :func:`_past_media`);
    ``prompt_cache_key``'s, the whole prompt."""
    prompt = gen.prompt_tokens
    pins = []
    for bp in req.cache_breakpoints:
        msgs = with_instruction(bp.messages, plan.instruction) if plan.instruction \
            else bp.messages
        variant = hooks.render_chat(model=model, messages=msgs, tools=bp.tools,
                                    template_kwargs=template_kwargs_of(req),
                                    reasoning_effort=req.reasoning_effort)
        if variant is None:
            continue
        shared = common_prefix(rendered, variant.tokens)
        at = shared if gen.media is None else _past_media(rendered, gen.media, shared)
        if at is not None:
            pins.append(Pin(at, bp.ttl))
    if req.prompt_cache_key is not None:
        pins.append(Pin(len(prompt), KEY_TTL, req.prompt_cache_key))
    return pins


def _past_media(rendered: list[int], media: MediaPrompt, at: int) -> int | None:
    """Where a breakpoint ``at`` tokens into the rendered prompt falls in the expanded
    one, when every media token lies before it: the text after the last media part is
    left as it is, so both prompts end in the same tokens. None for a breakpoint before
    (or inside) the media: a media prompt resumes only from a prefix holding them all."""
    pos = len(media.tokens) - (len(rendered) - at)
    if media.resume_from is None or pos < media.resume_from \
            or media.tokens[pos:] != rendered[at:]:
        return None
    return pos


def _sampler(model: LoadedModel, gen: GenerationRequest) -> None:
    gen.sampling.check_vocab(vocab_size(model))
    try:
        gen.sampler = gen.sampling.sampler(model.tokenizer)
        gen.processors = gen.sampling.logits_processors()
    except ValueError as exc:  # mlx-lm's own argument checks
        raise BadRequest(str(exc)) from None


def with_instruction(msgs: list[dict[str, Any]], instruction: str) -> list[dict[str, Any]]:
    """Templates often allow one leading system turn: extend it or add one."""
    if msgs and msgs[0]["role"] == "system" and isinstance(msgs[0].get("content"), str):
        first = dict(msgs[0], content=(msgs[0]["content"] + "\n\n" + instruction).strip())
        return [first] + msgs[1:]
    return [{"role": "system", "content": instruction}] + msgs


def media_pipeline(model: LoadedModel, hooks: ModelHooks,
                   kinds: Iterable[str]) -> MediaPipeline:
    """The one pipeline that takes every media kind of a request, or a 400 naming the
    model (never a silent text-only answer)."""
    names = sorted(set(kinds))
    media_parts.check_combination(names)
    found: list[MediaPipeline] = []
    for kind in names:
        pipeline = hooks.media_pipeline(model=model, kind=kind)
        if pipeline is None:
            raise media_parts.unsupported(model.id, kind)
        found.append(pipeline)
    if any(p is not found[0] for p in found):
        raise BadRequest(f"model {model.id} cannot combine {' and '.join(names)} parts in one "
                         "request", param="messages")
    return found[0]
