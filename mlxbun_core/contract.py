"""The shapes of the objects plugins hand back through the hooks.

These are structural :class:`typing.Protocol` types: a plugin never has to
inherit from them, only to provide the attributes and methods named here. They
are ``runtime_checkable`` so tests can assert ``isinstance(obj, ToolParser)``
(which checks that the names exist, not their signatures). One base class stands
beside them: :class:`LazyHeadPredictor`, a :class:`TokenPredictor` whose head's
weights load on first use, which the families with MTP heads subclass.

Plain data records that cross the boundary (:class:`~mlxbun_core.model.LoadedModel`,
:class:`~mlxbun_core.model.Prompt`, :class:`~mlxbun_core.model.LoadOptions`,
:class:`~mlxbun_core.model.DraftModel`) live in :mod:`mlxbun_core.model`; the
events a tool parser emits live in :mod:`mlxbun_core.events`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:
    import mlx.core as mx

    from .events import ParserEvent
    from .grammar.base import CompiledGrammar
    from .grammar.request import GrammarRequest
    from .media.parts import MediaItem
    from .model import MediaPrompt, Prompt

Tokenizer = Any
"""An mlx-lm ``TokenizerWrapper`` (``encode``, ``decode``, ``eos_token_ids``, the HF
tokenizer behind it)."""

Sampler: TypeAlias = "Callable[[mx.array], mx.array]"
"""mlx-lm's sampler: log-probabilities ``[batch, vocab]`` in, token ids ``[batch]`` out."""

LogitsProcessor: TypeAlias = "Callable[[mx.array, mx.array], mx.array]"
"""mlx-lm's logits processor: ``(tokens so far, logits) -> logits``."""

__all__ = ["DraftSource", "GrammarBackend", "GrammarBackendFactory", "LazyHeadPredictor",
           "LogitsProcessor", "MediaPipeline", "RegisterGrammarBackend", "Sampler",
           "TokenPredictor", "Tokenizer", "ToolParser", "load_head_weights"]


@runtime_checkable
class ToolParser(Protocol):
    """Splits one request's decoded text into content, tool calls and keep-alives.

    A fresh parser is made per request (``tool_call_parser`` hook), fed the decoded
    text as it streams, and finished once at the end of generation. It must give the
    same events however the text is chunked (once adjacent ``Content`` are merged),
    and it must never emit text it may later want back: hold a possible start of
    markup until it is decided. :class:`mlxbun_core.toolcalls.StreamingToolParser`
    implements this for any :class:`~mlxbun_core.toolcalls.Dialect`.
    """

    def feed(self, text: str) -> list[ParserEvent]:
        """Take the next decoded text; return what can be shown or called now:
        :class:`~mlxbun_core.events.Content`, :class:`~mlxbun_core.events.ToolCallEvent`
        (one complete call), :class:`~mlxbun_core.events.KeepAlive` (markup is
        buffering), or a call as it is written: :class:`~mlxbun_core.events.ToolCallStart`,
        :class:`~mlxbun_core.events.ToolCallDelta` pieces that join to exactly the
        arguments of the :class:`~mlxbun_core.events.ToolCallEvent` with the same id
        that ends it, or :class:`~mlxbun_core.events.ToolCallWithdrawn`. A parser that
        never streams a call just sends each one whole."""
        ...

    def finish(self, cut: bool = False) -> list[ParserEvent]:
        """Generation ended: flush held text. Markup that never closed is never a call
        made of what was there, nor text: ``cut`` (the budget or a stop sequence ended
        the reply) drops it; at the model's own EOS it is a call only if whole but for
        its end marker."""
        ...

    def call_grammar(self, tools: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The grammar of one call of any of ``tools`` in this parser's markup, with
        arguments that follow each tool's JSON schema, as a structural format
        (:mod:`mlxbun_core.grammar.structural`): a ``tag`` whose ``begin`` starts the
        markup. The engine repeats it for parallel calls, triggers it on ``begin`` for
        ``strict`` tools under ``auto`` and forces it for ``tool_choice`` required or
        a named function. ``None``: no grammar (a forced choice is then asked for in
        words, with a ``Warning`` header)."""
        ...

    max_calls: int | None
    """Set by the engine to 1 for ``parallel_tool_calls: false``: later calls are dropped."""
    unique: bool
    """Set by the engine under a forced tool choice: a repeat of an earlier call is dropped."""
    done: bool
    """True once nothing more can be emitted (``max_calls`` reached, or a repeat under
    ``unique``): the engine ends the reply there."""


@runtime_checkable
class MediaPipeline(Protocol):
    """Turns a request's media parts into model input and runs the forward pass.

    Asked through the ``media_pipeline`` hook once per media kind a request
    carries; every kind of one request must get the same pipeline (a model has
    one, answering for each kind it takes). The engine has already fetched and
    decoded the parts (:class:`~mlxbun_core.media.parts.MediaItem`: a PIL image, a
    16 kHz mono float32 array, or :class:`~mlxbun_core.media.decode.Video` frames)
    and rendered the chat template with a ``{"type": kind}`` placeholder per part,
    in document order. :class:`mlxbun_core.plugins_builtin.vlm.VlmPipeline` is the
    ready-made implementation on mlx-vlm.
    """

    kind: str
    """The kinds it takes, comma-joined (``"image,video"``), for logs."""
    kinds: frozenset[str]
    """``"image"``, ``"audio"`` and/or ``"video"``."""

    def prepare(self, prompt: Prompt, media: Sequence[MediaItem]) -> MediaPrompt:
        """Expand the media placeholders of ``prompt.text`` into the model's soft
        tokens for ``media`` (CPU work, on the preparation thread). Raise
        :class:`~mlxbun_core.errors.BadRequest` for media the model refuses. The
        returned :class:`~mlxbun_core.model.MediaPrompt` runs on the worker thread."""
        ...


@runtime_checkable
class DraftSource(Protocol):
    """A speculative-decoding proposer (``draft_source`` hook).

    The target model verifies ``num_draft_tokens`` proposals per forward pass
    (mlx-lm's ``speculative_generate_step``), so greedy output is unchanged; only
    speed differs. :class:`mlxbun_core.model.DraftModel` is the ready-made record
    for a small draft model.
    """

    model: Any
    """An ``mlx.nn.Module`` sharing the target's vocabulary, called like the target
    (``model(tokens, cache=...)`` returns logits)."""
    num_draft_tokens: int
    """Proposals per verification step."""
    name: str
    """Shown in the start-up banner and logs."""


@runtime_checkable
class TokenPredictor(Protocol):
    """A model's own multi-token-prediction head as a drafter (``token_predictor`` hook).

    The head reads the target's hidden states, so the speculative loop runs the target
    through :meth:`forward` (instead of calling the model) and keeps the head's own
    cache in step with the accepted tokens: a row per target position ``p``, pairing the
    target's state at ``p`` with the token at ``p + 1``; its logits propose the token
    at ``p + 2``. Drafts beyond the first chain the head's own output state. The target
    verifies every draft, so greedy output is the plain decode's whatever the head says.
    """

    name: str
    """Shown in the start-up banner and logs."""
    num_draft_tokens: int
    """Drafts per verify round when the operator and the request leave it unset."""
    kv_bytes_per_token: int
    """Bytes the head's cache (:meth:`make_cache`) adds per token of a request: it holds a
    row per target position, so memory admission bills this times the request's prompt
    plus completion budget beside the target's KV. Added after the first release: the
    engine reads it with a default of 0, so a predictor without it still loads (its
    head's KV then goes unbilled)."""
    weight_bytes: int
    """Bytes of the head's own weights (not the target's it shares) once loaded, known
    before they are (from the checkpoint's file headers, say): memory admission counts them
    as weights once :attr:`loaded`, and holds a request drafting with the head to what fits
    with them. Added after the first release: read with a default of 0."""
    loaded: bool
    """Whether the head's weights are resident now (a head may read them on first use, in
    :meth:`make_cache`). Added after the first release: read with a default of True."""

    def forward(self, tokens: mx.array, cache: list[Any]) -> tuple[mx.array, mx.array]:
        """The target's forward over ``tokens`` ``(1, L)`` with its ``cache`` (as the
        model call would): ``(logits (1, L, V), hidden (1, L, H))``, ``hidden`` being
        what :meth:`predict` reads."""
        ...

    def make_cache(self) -> list[Any]:
        """A fresh cache for the head (one per request)."""
        ...

    def predict(self, hidden: mx.array, tokens: mx.array,
                cache: list[Any]) -> tuple[mx.array, mx.array]:
        """Append rows pairing ``hidden[:, i]`` with ``tokens[:, i]`` (the token after
        that state) to the head's ``cache``; ``(logits (1, V), state (1, L, H))``: the
        logits of the token after the LAST row's token (the only row a draft needs, so
        the output head runs once) and, per row, the state a chained draft passes back in
        as ``hidden``. The caller trims rows it chained on drafts."""
        ...


class LazyHeadPredictor:
    """A :class:`TokenPredictor` whose head's weights are read on first use
    (:meth:`make_cache`), so a server that never drafts with the head spends no memory on
    it; the shared part of the families' MTP heads (Qwen3.5, GLM-5.x).

    ``backbone`` is the target's inner model (mlx-lm's ``model.model``: ``embed_tokens``,
    the layers and the final norm); ``load_head()`` builds the head, a module called as
    ``head(hidden, embeds, cache) -> (state, normed)``: the state a chained draft passes
    back in, and what the output head reads. A family gives :meth:`logits` and
    :meth:`head_cache`, and :meth:`head_input` where the head reads something other than
    the backbone's normed output.
    """

    default_on = False
    """Whether the engine drafts with the head unless told ``--mtp off``."""

    def __init__(self, backbone: Any, load_head: Callable[[], Any], *, name: str,
                 num_draft_tokens: int, kv_bytes_per_token: int, weight_bytes: int) -> None:
        self.backbone, self._load_head = backbone, load_head
        self._head: Any = None
        self.name, self.num_draft_tokens = name, num_draft_tokens
        self.kv_bytes_per_token, self.weight_bytes = kv_bytes_per_token, weight_bytes

    @property
    def loaded(self) -> bool:
        """Whether the head's weights are resident (read on first use)."""
        return self._head is not None

    @property
    def head(self) -> Any:
        if self._head is None:
            self._head = self._load_head()
        return self._head

    def logits(self, normed: mx.array) -> mx.array:
        """The target's output head over final (normed) states."""
        raise NotImplementedError

    def head_cache(self) -> list[Any]:
        """A fresh cache for the loaded head."""
        raise NotImplementedError

    def head_input(self, normed: mx.array) -> mx.array:
        """What the head reads of the target's final normed states (those, unless a family
        says otherwise)."""
        return normed

    def forward(self, tokens: mx.array, cache: list[Any]) -> tuple[mx.array, mx.array]:
        normed = self.backbone(tokens, cache)
        return self.logits(normed), self.head_input(normed)

    def make_cache(self) -> list[Any]:
        self.head  # noqa: B018 (reads the weights on first use)
        return self.head_cache()

    def predict(self, hidden: mx.array, tokens: mx.array,
                cache: list[Any]) -> tuple[mx.array, mx.array]:
        state, normed = self.head(hidden, self.backbone.embed_tokens(tokens), cache[0])
        return self.logits(normed[:, -1]), state


def load_head_weights(head: Any, weights: dict[str, Any],
                      config: dict[str, Any]) -> Any:
    """``head`` with ``weights`` (its own parameter names) in it, ready to run: quantized as
    the checkpoint's ``quantization`` says where the weights carry scales, every parameter
    loaded (strict), evaluated, in eval mode."""
    import mlx.core as mx
    import mlx.nn as nn

    quant = config.get("quantization") or config.get("quantization_config")
    if any(k.endswith(".scales") for k in weights) and isinstance(quant, dict):
        nn.quantize(head, group_size=quant.get("group_size", 64), bits=quant.get("bits", 4),
                    class_predicate=lambda p, m: f"{p}.scales" in weights)
    head.load_weights(list(weights.items()), strict=True)
    head.eval()
    mx.eval(head.parameters())
    return head


@runtime_checkable
class GrammarBackend(Protocol):
    """Compiles structured-output requests for one tokenizer.

    Made by a factory registered through ``register_grammar_backends``; the grammar
    registry caches compiled grammars and does the masking, so a backend only turns
    a :class:`~mlxbun_core.grammar.request.GrammarRequest` into a
    :class:`~mlxbun_core.grammar.base.CompiledGrammar` whose ``new_matcher()`` makes
    per-request matchers (``consume(ids) -> bool``, ``fill(bitmask)``, ``error()``).
    Raise :class:`~mlxbun_core.grammar.base.GrammarCompileError` for a constraint it
    cannot enforce (the request then degrades with a warning).
    """

    name: str

    def compile(self, req: GrammarRequest) -> CompiledGrammar:
        ...


GrammarBackendFactory = Callable[[Tokenizer], GrammarBackend]
"""``factory(tokenizer)``: a backend bound to one tokenizer's vocabulary."""

RegisterGrammarBackend = Callable[[str, GrammarBackendFactory], None]
"""The ``register(name, factory)`` callable handed to ``register_grammar_backends``."""
