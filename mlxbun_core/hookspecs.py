"""The whole plugin contract of mlxbun.

Every model family, tool-call dialect, media pipeline, draft source and grammar
backend reaches the engine through these hooks. Implementations may accept any
subset of a hook's arguments (pluggy passes them by name), so adding an argument
here never breaks an existing plugin.

Most hooks are ``firstresult``: plugins are asked in priority order and the first
non-None answer wins. ``None`` always means "not mine, ask the next plugin". The
built-in generic plugin answers last (``trylast``) so any family plugin overrides it.
"""

from pluggy import HookimplMarker, HookspecMarker

hookspec = HookspecMarker("mlxbun")
hookimpl = HookimplMarker("mlxbun")


@hookspec(firstresult=True)
def load_model(path, config, options):
    """Claim a checkpoint and load its forward pass.

    ``path`` is a local checkpoint directory (Hugging Face layout), ``config`` its
    parsed ``config.json`` and ``options`` a :class:`mlxbun_core.model.LoadOptions`.
    Return a :class:`mlxbun_core.model.LoadedModel` whose ``family`` names the
    claiming plugin, or ``None`` when the checkpoint is not yours.
    firstresult: the first plugin to return a model wins.
    """


@hookspec(firstresult=True)
def render_chat(model, messages, tools, template_kwargs, reasoning_effort):
    """Turn chat messages into a prompt for ``model``.

    ``messages`` are OpenAI-shaped dicts (already normalized: ``reasoning_content``
    set from the ``reasoning`` alias), ``tools`` the OpenAI function tools or
    ``None``, ``template_kwargs`` the request's ``chat_template_kwargs`` and
    ``reasoning_effort`` one of none/minimal/low/medium/high/xhigh or ``None``.
    Return a :class:`mlxbun_core.model.Prompt`; ``None`` means "not my model".
    Raise :class:`mlxbun_core.errors.BadRequest` for input the template rejects.
    firstresult.
    """


@hookspec(firstresult=True)
def tool_call_parser(model, tools):
    """Make a fresh streaming tool-call parser for one request.

    Return an object with ``feed(text) -> list[event]`` and ``finish() -> list[event]``
    (see :mod:`mlxbun_core.toolcalls`), or ``None`` when the model is not yours.
    Only asked when the request carries tools. firstresult.
    """


@hookspec(firstresult=True)
def media_pipeline(model, kind):
    """Return the pipeline that turns ``kind`` ("image", "audio" or "video") parts
    into prompt embeddings for ``model``, or ``None`` when the model has none.
    A request carrying media no plugin accepts is answered with a 400 naming the
    model. firstresult.
    """


@hookspec(firstresult=True)
def draft_source(model, options):
    """Return a speculative-decoding draft source for ``model`` (a small draft model
    or a model-free proposer such as n-gram lookup), or ``None``. firstresult.
    """


@hookspec(firstresult=True)
def embed(model, texts, instruction):
    """Embed ``texts`` with an embedding ``model``.

    Return ``(vectors, prompt_tokens)``: a list of float lists (unit length) and
    the number of tokens consumed, or ``None`` when the model is not yours or is
    not an embedding model. firstresult.
    """


@hookspec
def register_grammar_backends(register):
    """Register structured-output backends: ``register(name, factory)`` where
    ``factory(tokenizer)`` returns a :class:`mlxbun_core.grammar.GrammarBackend`.
    Called once at start-up; all answers are collected.
    """
