"""The whole plugin contract of mlxbun.

Every model family, tool-call dialect, media pipeline, draft source and grammar
backend reaches the engine through these hooks. Mark implementations with
:data:`hookimpl`. An implementation may accept any subset of a hook's arguments
(pluggy passes them by name), so adding an argument here never breaks a plugin.

**Claiming and routing.** Loading a checkpoint asks :func:`claims` of every plugin
(cheap: ``config.json`` and file names only). The answer is a family name; the
plugin that provides that family (its module or object attribute ``FAMILY``)
then loads the weights in :func:`load_model`. From then on every per-model hook
(one that takes ``model``) is asked of that plugin first and of the built-in
``generic`` plugin as fallback, never of another family, so an implementation
never checks "is this model mine?".

A plugin with a plain (non-wrapper) implementation of any hook in
:data:`FAMILY_HOOKS` is a *family plugin*. Every other plugin is an *extension*
(the built-in draft-model plugin, grammar backends, a tracing wrapper): it is
asked for every model, whoever claimed it. Wrapper implementations
(``@hookimpl(wrapper=True)``) see every call they wrap, claims included.

Most hooks are ``firstresult``: implementations are asked in priority order
(``tryfirst``, then newest-registered first, then ``trylast``) and the first
non-``None`` answer wins. ``None`` always means "no answer from me".

The types named in annotations: :mod:`mlxbun_core.model` (``LoadedModel``,
``Prompt``, ``LoadOptions``, ``DraftModel``), :mod:`mlxbun_core.contract` (the
``ToolParser``, ``MediaPipeline``, ``DraftSource``, ``TokenPredictor`` and ``GrammarBackend``
Protocols), :mod:`mlxbun_core.events` (what a tool parser emits).

**Routes and commands.** :func:`register_routes` and :func:`register_commands` are how
the server's HTTP surfaces and ``mlxbun``'s verbs come to be: the core's own inference
APIs (built-in plugin ``api``) and the web app (built-in plugin ``webapp``) register
through them as any installed plugin does (datasette and llm work this way).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pluggy import HookimplMarker, HookspecMarker

from .contract import DraftSource, MediaPipeline, RegisterGrammarBackend, TokenPredictor, ToolParser

if TYPE_CHECKING:
    import numpy as np
    from blacksheep import Application

    from .model import LoadedModel, LoadOptions, Prompt
    from .speech import TranscribeOptions, Transcription

hookspec = HookspecMarker("mlxbun")
hookimpl = HookimplMarker("mlxbun")

FAMILY_HOOKS = frozenset({"claims", "load_model", "render_chat", "tool_call_parser", "embed",
                          "rerank", "transcribe"})
"""Hooks only a model family can answer. A plugin implementing any of them (other
than as a wrapper) is a family plugin and is asked only about models it claimed."""

GENERIC = "generic"
"""The built-in fallback family: asked after the claiming family for every model."""


@hookspec(firstresult=True)
def claims(path: Path, config: dict[str, Any], options: LoadOptions) -> str | None:
    """Say whether a checkpoint belongs to your family, without loading it.

    Called for every checkpoint mlxbun loads, and by model listings for every
    checkpoint on disk, so it must be cheap: read ``config`` and, at most, small
    files or file names under ``path``. Never read tensor data or import heavy
    modules (``mlx_lm``, ``transformers``) here.

    :param path: The local checkpoint directory (Hugging Face layout). It may hold
        no weights at all (a listing of configs).
    :param config: The parsed ``config.json`` (``{}`` when there is none).
    :param options: What the operator asked for (``options.model_id`` is the name
        the model was requested by, ``options.embedding`` forces embedding mode).
    :returns: Your family name (the plugin's ``FAMILY``), or ``None`` when the
        checkpoint is not yours.

    Stops at the first non-``None`` result. The built-in generic plugin answers
    last (``"generic"`` for anything mlx-lm has a model definition for), so a family
    only has to recognise its own checkpoints. Claim narrowly: ``model_type``,
    ``architectures``, a tokenizer or template marker.
    """


@hookspec(firstresult=True)
def load_model(path: Path, config: dict[str, Any], options: LoadOptions) -> LoadedModel | None:
    """Load the weights of a checkpoint your :func:`claims` answered for.

    Only the claiming plugin is asked (plus extension wrappers), so there is
    nothing to check again; load and return.

    :param path: The checkpoint directory :func:`claims` saw.
    :param config: Its parsed ``config.json``.
    :param options: The operator's :class:`~mlxbun_core.model.LoadOptions`. Under
        ``mlxbun serve --distributed`` every rank calls this with ``options.shard``
        set (a :class:`~mlxbun_core.model.ShardPlan` holding the
        ``mx.distributed`` group): load lazily, call ``options.shard.apply(module)``
        before the weights are evaluated so each rank reads only its part, then
        return as usual (``family.load_mlx_lm`` does this). A model returned whole
        is sharded by the engine afterwards (correct, but every rank read it all).
        Under ``--context-length`` past the trained window, ``options.extra["window"]``
        holds the plan: build the model from its ``overrides`` (mlx-lm's
        ``load(..., model_config=...)``) and set ``extras["rope_scaling"]`` to its
        ``rope``, as ``family.load_mlx_lm`` does; a model loaded without it is refused.
    :returns: A :class:`~mlxbun_core.model.LoadedModel`. The loader fills in
        ``family`` and ``plugin`` from the claim, merges ``generation_config.json``
        over ``generation_defaults`` and fills ``context_window`` when unset.
        ``None`` is a plugin bug (it claimed what it cannot load) and fails the load
        with a message naming the plugin.

    Stops at the first non-``None`` result.
    """


@hookspec(firstresult=True)
def render_chat(model: LoadedModel, messages: list[dict[str, Any]],
                tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any],
                reasoning_effort: str | None) -> Prompt | None:
    """Turn chat messages into the prompt for one request.

    :param model: The loaded model (one your plugin claimed).
    :param messages: OpenAI-shaped message dicts, normalized by the engine: roles
        checked, ``reasoning_content`` set from the ``reasoning`` alias, tool-call
        arguments decoded to objects where they were JSON text.
    :param tools: The request's OpenAI function tools, or ``None`` (none given, or
        ``tool_choice: "none"``).
    :param template_kwargs: The request's ``chat_template_kwargs`` (for example
        ``{"enable_thinking": False}``), with its ``reasoning_effort`` under that name when
        it sent a level (templates that take a depth read it) and ``serve --thinking`` as
        ``enable_thinking`` when it set neither; pass them to the template; do not mutate it.
    :param reasoning_effort: ``"none"``, ``"minimal"``, ``"low"``, ``"medium"``,
        ``"high"``, ``"xhigh"`` or ``None`` (not given).
    :returns: A :class:`~mlxbun_core.model.Prompt`: the token ids, and for a model
        with a think channel its markers and whether the prompt already opened it.
        ``None`` passes the question to the generic plugin (the checkpoint's own
        chat template).

    Raise :class:`mlxbun_core.errors.BadRequest` for input the template refuses;
    it becomes a 400 in the surface's error shape.

    Stops at the first non-``None`` result. Routed: asked of the claiming family,
    then the generic plugin.
    """


@hookspec(firstresult=True)
def tool_call_parser(model: LoadedModel, tools: list[dict[str, Any]]) -> ToolParser | None:
    """Make a fresh streaming tool-call parser for one request.

    Only asked when the request carries tools.

    :param model: The loaded model.
    :param tools: The request's tools (OpenAI function shape), for argument
        coercion against their JSON schemas.
    :returns: A new :class:`~mlxbun_core.contract.ToolParser` (usually
        ``StreamingToolParser(YourDialect(), tools)``; a dialect whose ``scanner()``
        gives an incremental reader streams each call as it is written, else each
        call goes out whole once its markup closes). ``None`` passes to the
        generic plugin, which follows mlx-lm's tool-parser choice for the tokenizer
        and falls back to ``<tool_call>{json}</tool_call>``.

    Stops at the first non-``None`` result. Routed: asked of the claiming family,
    then the generic plugin.
    """


@hookspec(firstresult=True)
def media_pipeline(model: LoadedModel, kind: str) -> MediaPipeline | None:
    """Give the pipeline that turns media parts into model input and runs the model.

    Asked for each media kind a request's messages carry (before anything is
    fetched), and by ``/v1/models`` for its ``vision`` / ``audio`` / ``video``
    fields, so answer from what is cheap to know (config, weight names).

    :param model: The loaded model.
    :param kind: ``"image"``, ``"audio"`` or ``"video"``.
    :returns: The model's :class:`~mlxbun_core.contract.MediaPipeline` when it takes
        ``kind`` (the same object for every kind it takes: one request may mix
        them), or ``None``; if no plugin answers, the request is refused with a 400
        naming the model. ``mlxbun_core.plugins_builtin.vlm.pipeline_for`` serves any
        architecture mlx-vlm knows.

    Stops at the first non-``None`` result. Routed: asked of the claiming family,
    extensions, then the generic plugin.
    """


@hookspec(firstresult=True)
def draft_source(model: LoadedModel, options: LoadOptions) -> DraftSource | None:
    """Give a speculative-decoding proposer for ``model``, asked once at start-up.

    :param model: The loaded target model.
    :param options: The operator's load options (``options.extra["draft_model"]``
        is ``--draft-model``, ``options.extra["num_draft_tokens"]`` its step).
    :returns: A :class:`~mlxbun_core.contract.DraftSource` (for example a
        :class:`~mlxbun_core.model.DraftModel`), after which every eligible request
        decodes speculatively; or ``None`` for plain decoding. Raise ``ValueError``
        for a draft that cannot work with this model (a different vocabulary).

    Stops at the first non-``None`` result. Routed: asked of the claiming family
    (its own proposer, such as multi-token-prediction heads, comes first), then
    extensions; the built-in draft-model plugin answers last.
    """


@hookspec(firstresult=True)
def token_predictor(model: LoadedModel) -> TokenPredictor | None:
    """Give the checkpoint's own multi-token-prediction head as a drafter, asked once
    at start-up for a generation model.

    :param model: The loaded target model.
    :returns: A :class:`~mlxbun_core.contract.TokenPredictor` when the checkpoint ships
        such a head (for example Qwen3.5's ``mtp.*`` weights), else ``None``. Keep it
        cheap when unused: read only headers here, the weights on first use
        (:class:`~mlxbun_core.contract.LazyHeadPredictor` does that part). With
        one, ``--draft-kind mtp`` and a request's ``draft_kind: "mtp"`` decode
        speculatively with it; without, the flag fails start-up and the request gets a 400.

    Stops at the first non-``None`` result. Routed: asked of the claiming family, then
    the generic plugin (which has none).
    """


@hookspec(firstresult=True)
def embed(model: LoadedModel, texts: list[str],
          instruction: str | None) -> tuple[list[list[float]], int] | None:
    """Embed texts with an embedding model (``LoadedModel.kind == "embedding"``).

    Runs on the model's worker thread; the engine only asks models whose ``kind``
    is ``"embedding"``.

    :param model: The loaded embedding model.
    :param texts: The input texts, at least one.
    :param instruction: A task instruction for query-side embedding, or ``None``.
    :returns: ``(vectors, prompt_tokens)``: one unit-length float list per text,
        in order, and the number of tokens consumed. ``None`` means the model
        cannot embed (the request gets a 400).

    Stops at the first non-``None`` result. Routed: asked of the claiming family,
    then the generic plugin.
    """


@hookspec(firstresult=True)
def rerank(model: LoadedModel, query: str, documents: list[str], instruction: str | None,
           max_doc_tokens: int | None) -> tuple[list[float], int] | None:
    """Score documents against a query with a reranker (``LoadedModel.kind == "rerank"``).

    Runs on the model's worker thread; the engine only asks models whose ``kind`` is
    ``"rerank"``, and may split one request's documents over several calls (other work
    runs between them), so score each document on its own: a document's score must not
    depend on which others share its call.

    :param model: The loaded reranker.
    :param query: The search query.
    :param documents: The texts to score, at least one.
    :param instruction: A task instruction for the model, or ``None`` (its default).
    :param max_doc_tokens: Cut each document to this many tokens first, or ``None``.
    :returns: ``(scores, prompt_tokens)``: one relevance in ``[0, 1]`` per document, in
        order (higher is more relevant), and the number of tokens consumed (padding not
        counted). ``None`` means the model cannot rerank (the request gets a 400).

    Stops at the first non-``None`` result. Routed: asked of the claiming family, then
    the generic plugin.
    """


@hookspec(firstresult=True)
def transcribe(model: LoadedModel, audio: np.ndarray,
               options: TranscribeOptions) -> Transcription | None:
    """Turn speech into text with a speech model (``LoadedModel.kind == "speech"``).

    Runs on the model's worker thread; the engine only asks models whose ``kind`` is
    ``"speech"``. Serves ``POST /v1/audio/transcriptions`` and ``mlxbun transcribe``.

    :param model: The loaded speech model.
    :param audio: The whole recording: mono float32 samples at 16 kHz
        (``mlxbun_core.speech.SAMPLE_RATE``), decoded by the core, at least one sample.
    :param options: A :class:`~mlxbun_core.speech.TranscribeOptions`: ``language`` (a
        code, or ``None`` to detect it), ``prompt``, ``temperature`` (``None``: your
        model's default schedule) and ``words`` (word timestamps wanted).
    :returns: A :class:`~mlxbun_core.speech.Transcription`: the text, the language, the
        duration and, where the model times its output, segments (each with ``words``
        when ``options.words``). ``None`` means the model cannot transcribe (a 400).

    Raise :class:`mlxbun_core.errors.BadRequest` for options the model refuses (a
    language it does not know). Stops at the first non-``None`` result. Routed: asked
    of the claiming family, then the generic plugin.
    """


@hookspec
def register_grammar_backends(register: RegisterGrammarBackend) -> None:
    """Register structured-output backends, once at start-up.

    :param register: Call ``register(name, factory)`` for each backend, where
        ``factory(tokenizer)`` returns a :class:`~mlxbun_core.contract.GrammarBackend`
        bound to that tokenizer. ``--grammar-backend NAME`` selects one.

    Every implementation is called (not firstresult); not routed (backends serve
    every model).
    """


@hookspec(firstresult=True)
def model_report(model: LoadedModel, section: str) -> dict[str, dict[str, Any]] | None:
    """Blocks a family adds to ``GET /stats`` or ``GET /fit`` about its loaded model.

    For state only the family knows (a streamed-expert cache's hits and misses, slab
    sizes read from its checkpoint). Called per request, so keep ``"stats"`` cheap;
    ``"fit"`` runs off the event loop and may read file headers (cache what you can).

    :param model: The loaded model (one your plugin claimed).
    :param section: ``"stats"`` or ``"fit"``: the route asking.
    :returns: ``{block_name: JSON-able dict}``, merged at the top level of the route's
        answer (a name the route already uses is ignored), or ``None`` for nothing.

    Stops at the first non-``None`` result. Routed: asked of the claiming family,
    then the generic plugin (which has nothing to add).
    """


@hookspec
def register_routes(app: Application, engine: Any) -> None:
    """Add HTTP routes to the application serving ``engine``, once per app.

    :param app: The BlackSheep application (an :class:`mlxbun_core.server.state.App`):
        add routes with ``app.router.add_get(path, handler)`` and the like; what routes
        share lives in ``app.state`` (see :mod:`mlxbun_core.server.state`).
    :param engine: The served :class:`mlxbun_core.engine.core.Engine` (typed ``Any``
        here: the contract stands below the engine).

    Every implementation is called (not firstresult); not routed. The core's inference
    APIs register first (``tryfirst``), the web app last (``trylast``), installed
    plugins in between. Paths under ``/api/``, ``/admin/``, ``/v1/adapters``,
    ``/v1/memory`` and ``/ws/chat`` are admin routes for the guard.
    """


@hookspec
def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add verbs to the ``mlxbun`` command.

    :param subparsers: The ``mlxbun`` parser's sub-parsers: ``p =
        subparsers.add_parser("verb", help=...)``, its arguments, then
        ``p.set_defaults(handler=fn)`` where ``fn(args: argparse.Namespace) -> int`` runs
        the verb and returns the exit status.

    Every implementation is called (not firstresult); not routed. Called whenever the
    command line is parsed, so import what the verb needs inside ``fn``, not here.
    """
