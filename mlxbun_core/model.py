"""Plain data that crosses the plugin boundary: what a loaded model is, what a
rendered prompt is, and the options a load receives.

Nothing here imports the rest of the package (:mod:`.sidetable` is a leaf).
``LoadedModel.hooks`` needs the plugin manager's routing, so :mod:`mlxbun_core.plugins`
hands it in (``LoadedModel.relay_for``) when it is imported, which importing
``mlxbun_core`` always does first.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from .sidetable import SideTable


class ShardUnsupported(Exception):
    """The architecture cannot be split across the group the way it was asked."""


@dataclass(frozen=True)
class ShardPlan:
    """This process's part of a distributed serve (``mlxbun serve --distributed``).

    ``group`` is the ``mx.distributed.Group`` every rank joined; ``pipeline`` asks for
    pipeline parallelism (layers split across ranks) instead of tensor parallelism (each
    layer's matrices split across ranks). A family's ``load_model`` that sees a plan
    loads lazily, calls :meth:`apply` on the ``nn.Module`` before evaluating its
    weights (so each rank reads only its shard), and returns the model as usual; the
    engine shards, after the fact, a model a plugin returned whole.
    """

    group: Any
    pipeline: bool = False

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def size(self) -> int:
        return int(self.group.size())

    def mode(self, module: Any) -> str:
        """``"tensor"`` or ``"pipeline"``: what ``module`` gets (tensor parallel where the
        architecture has ``shard()`` unless pipeline was asked; pipeline where it has
        ``model.pipeline()``); :class:`ShardUnsupported` names the architecture otherwise."""
        tensor = callable(getattr(module, "shard", None))
        pipe = callable(getattr(getattr(module, "model", None), "pipeline", None))
        arch = type(module).__module__.rpartition(".")[2] or type(module).__name__
        if self.pipeline:
            if pipe:
                return "pipeline"
            raise ShardUnsupported(f"architecture {arch!r} has no pipeline parallelism in "
                                   "this mlx-lm" + ("; drop --pipeline (it has tensor "
                                                    "parallelism)" if tensor else ""))
        if tensor:
            return "tensor"
        if pipe:
            return "pipeline"
        raise ShardUnsupported(f"architecture {arch!r} can be split neither by tensor "
                               "parallelism (no shard()) nor by pipeline (no pipeline()) "
                               "in this mlx-lm: it cannot be served with --distributed")

    def apply(self, module: Any) -> str:
        """Keep only this rank's shard of ``module`` (lazy weights stay unread); the mode
        used. Idempotent: a module already sharded is left alone."""
        done = SHARDED.get(module)
        if done:
            return done
        mode = self.mode(module)
        if mode == "pipeline":
            module.model.pipeline(self.group)
        else:
            module.shard(self.group)
        SHARDED.set(module, mode)
        return mode

    @staticmethod
    def applied(module: Any) -> str | None:
        """The mode ``module`` was sharded in by :meth:`apply`; None: it is whole."""
        return SHARDED.get(module)


SHARDED: SideTable[str] = SideTable()  # module -> the mode apply() gave it (not on the module)


@dataclass
class LoadOptions:
    """What the operator asked for at start-up; plugins read what they need."""

    model_id: str = ""
    embedding: bool = False  # force embedding mode for a plain checkpoint
    extra: dict[str, Any] = field(default_factory=dict)
    # the local library a model name may be a query over (the CLI passes its scan; see
    # models.resolve.Library); None: names resolve as paths and hub ids only
    library: Callable[[], Iterable[Any]] | None = None
    # serving across several processes (--distributed): load only this rank's shard
    shard: ShardPlan | None = None
    # --context-length: the window to serve (None: the checkpoint's own). The loader
    # turns it into ``extra["window"]`` (a ``models.window.WindowPlan``) before the
    # claimant loads; ``family.load_mlx_lm`` builds the model with its config overrides
    context_length: int | None = None


@dataclass
class LoadedModel:
    """A checkpoint claimed and loaded by one plugin.

    ``model`` is an ``mlx.nn.Module`` whose ``__call__(tokens, cache=...)`` returns
    logits (the mlx-lm convention) and which provides ``make_cache()`` or ``layers``;
    ``tokenizer`` is an mlx-lm ``TokenizerWrapper``.
    """

    id: str
    path: Path
    config: dict[str, Any]
    model: Any
    tokenizer: Any
    family: str = ""  # the claiming family, e.g. "generic" or "qwen35"; set by the loader
    plugin: str = ""  # the registered name of the plugin that claimed it; set by the loader
    kind: str = "generate"  # "generate", "embedding", "rerank" or "speech"
    generation_defaults: dict[str, Any] = field(default_factory=dict)
    context_window: int | None = None
    reasoning: bool = False  # has a switchable thinking channel
    extras: dict[str, Any] = field(default_factory=dict)

    relay_for: ClassVar[Callable[[LoadedModel], Any] | None] = None
    """How a model finds its hook relay: :func:`mlxbun_core.plugins.model_hooks`, set by
    that module as it loads (it owns the routing; this record only asks)."""

    @property
    def eos_token_ids(self) -> set[int]:
        return set(getattr(self.tokenizer, "eos_token_ids", None) or [])

    @property
    def hooks(self) -> Any:
        """This model's hook relay: ``model.hooks.render_chat(model=model, ...)`` asks
        the plugin that claimed it, then the generic plugin, never another family
        (see :func:`mlxbun_core.plugins.model_hooks`)."""
        relay_for = type(self).relay_for
        if relay_for is None:  # only while mlxbun_core itself is being imported
            raise RuntimeError("mlxbun_core.plugins is not loaded yet: no hook routing")
        return relay_for(self)


@dataclass
class Prompt:
    """A rendered prompt.

    ``tokens`` are what the model sees. ``in_reasoning`` is true when the template
    already opened a think channel, so generation starts inside it; ``think_start``
    / ``think_end`` are the channel markers in decoded text (``None`` when the model
    has no such channel).
    """

    tokens: list[int]
    text: str = ""
    in_reasoning: bool = False
    think_start: str | None = None
    think_end: str | None = None
    media: list[Any] = field(default_factory=list)


@dataclass
class DraftModel:
    """A small draft model as a speculative-decoding source (``draft_source`` hook);
    satisfies :class:`mlxbun_core.contract.DraftSource`.

    ``model`` is a draft ``mlx.nn.Module`` sharing the target's vocabulary; the
    target verifies ``num_draft_tokens`` proposals per forward (mlx-lm's
    ``speculative_generate_step``).
    """

    model: Any
    num_draft_tokens: int = 2
    name: str = ""


@dataclass
class MediaPrompt:
    """A prompt whose media a :class:`~mlxbun_core.contract.MediaPipeline` has prepared.

    ``tokens`` are the prompt ids with every media placeholder expanded to the
    model's soft tokens (what usage and the context check count). ``run`` is called
    once, on the model's worker thread, with the request's sampler and logits
    processors, and yields ``(token, logprobs)`` like mlx-lm's ``generate_step``
    (endless; the caller stops it): it encodes the media, prefills and decodes.
    A ``run`` that also takes keywords ``prefill_step`` (tokens per prefill chunk) and
    ``between_chunks`` (call it with the tokens read so far after each chunk; it raises
    when the request was cancelled) lets a cancel land during a long prefill.
    ``digest`` hashes the media in order, so a prompt cache keys on it.
    A ``run`` that also takes ``prompt_cache`` and ``start`` fills the cache it is
    given (from ``new_cache()``), so the engine keeps the prompt's KV in its prefix
    cache, and resumes from a cached prefix of ``start`` tokens when ``start`` is at
    least ``resume_from`` (every media token lies before it; None: never resume).
    """

    tokens: list[int]
    kinds: frozenset[str]
    digest: str
    run: Any = None
    resume_from: int | None = None
    new_cache: Any = None
