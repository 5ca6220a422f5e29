"""What ``mlxbun serve`` does before the first request: find what would fail (a busy port, a
missing grammar backend) before minutes of model loading, load the model, print the banner,
then serve until a drain. ``--isolate`` hands over to the proxy parent (:mod:`.isolate`) right
after the checks.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from .request_fields import flag_fields

if TYPE_CHECKING:
    from .engine.core import Engine
    from .engine.speculate import SpecConfig
    from .kvstore.config import SsdConfig
    from .models.resolve import ResolvedModel
    from .server.origin import CorsRules

SAMPLING_FLAGS = tuple(f.name for f in flag_fields())  # serve flags that set a sampler default


class StartFailed(Exception):
    """Start-up cannot go on; the message has been printed, ``status`` is the exit status."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def configure_media(args: argparse.Namespace) -> None:
    """The media fetcher's destination policy from the serve flags."""
    from .media import fetch

    fetch.policy.allow_private = bool(args.allow_private_media)


def configure_run(args: argparse.Namespace) -> None:
    """The run configuration (flags > environment > file > defaults) installed for the
    code below start-up, which reads it instead of the environment; and the thread
    switch interval it names (``MLXBUN_SWITCH_INTERVAL_MS``)."""
    from .config.runtime import build
    from .runconfig import install

    config = build(args)
    install(config)
    if config.engine.switch_interval_ms is not None:
        sys.setswitchinterval(config.engine.switch_interval_ms / 1e3)


# optional grammar backends and the extra that installs each
GRAMMAR_EXTRAS = {"xgrammar": "mlxbun[xgrammar]"}


def select_grammar_backend(name: str) -> str | None:
    """None when ``name`` is usable, else what to tell the operator."""
    from .grammar_registry import registry

    try:
        registry.select(name)
    except ValueError as exc:
        extra = GRAMMAR_EXTRAS.get(name)
        if extra and importlib.util.find_spec(name) is None:
            return (f"grammar backend {name!r} is not installed: "
                    f"pip install '{extra}' (it brings {name} and what it needs)")
        return str(exc)
    return None


def cors_rules(args: argparse.Namespace) -> CorsRules:
    """The sites ``--cors`` (or ``MLXBUN_CORS``) trusts; ValueError for a value that is no
    origin (:func:`preflight` says so before anything loads)."""
    from .server.origin import CorsRules

    return CorsRules.from_values(getattr(args, "cors", None) or ())


def check_cors(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--cors``, if anything; a wildcard is said out loud."""
    try:
        rules = cors_rules(args)
    except ValueError as exc:
        return str(exc)
    if rules.wildcard and not args.unix:
        who = ("every web page you visit" if rules.any_site
               else "any page opened from a file, or framed sandboxed by any site,")
        logging.getLogger("mlxbun.guard").warning(
            "--cors %s: %s may call this server's API routes and read the answers (admin "
            "routes and the web chat stay closed to other sites); name the sites you trust "
            "instead when you can", "*" if rules.any_site else "null", who)
    return None


def preflight(args: argparse.Namespace) -> tuple[socket.socket | None, str | None]:
    """(bound socket or None, problem or None): what would fail is found before minutes
    of model loading, not after."""
    problem = (args.grammar_backend and select_grammar_backend(args.grammar_backend)) \
        or check_cors(args)
    if problem or args.unix:
        return None, problem or None
    from .server.ports import bind_port

    sock = bind_port(args.host, args.port)
    return (None, sock) if isinstance(sock, str) else (sock, None)


def cmd_serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``mlxbun serve``: checks, then the proxy parent (``--isolate``) or this process's
    engine and app. ``parser`` is the whole command line's (the parent rebuilds the
    engine children's flags from it)."""
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    from .kvstore.flags import config_from_args
    from .serve_switches import refusals

    refused = refusals(args)
    for why in refused:
        print(f"mlxbun: {why}", file=sys.stderr)
    if refused:
        return 2
    ssd, problem = config_from_args(args)
    sock, problem = (None, problem) if problem else preflight(args)
    if problem:
        print(f"mlxbun: {problem}", file=sys.stderr)
        return 2
    if args.isolate:  # the children get every serve flag that was set (media policy included)
        from .isolate.launch import run_parent

        if sock is not None:
            sock.close()  # a probe only: the proxy parent binds the address itself, at once
        return run_parent(args, parser)
    if args.model_pool != 1:
        print("mlxbun: --model-pool needs --isolate; ignored", file=sys.stderr)
    if not args.unix and (args.pins or args.allow_models or args.keep_alive is not None):
        print("mlxbun: --pin, --allow-model and --keep-alive need --isolate; ignored",
              file=sys.stderr)
    configure_media(args)
    configure_run(args)
    from .backend import keep_compiled_kernels
    from .models.paths import mlxbun_home
    from .serve_switches import apply_switches

    kept = keep_compiled_kernels(mlxbun_home())
    if kept is not None:
        logging.getLogger("mlxbun").info("compiled kernels kept in %s", kept)
    for applied in apply_switches(args):
        logging.getLogger("mlxbun").info("decode route: %s", applied)
    try:
        engine = load_engine(args, ssd)
    except StartFailed as exc:
        return exc.status
    if getattr(args, "adapter_mixing", None) is not None:
        engine.adapters.mixing = args.adapter_mixing == "on"
    from .config.permodel import apply_model_settings

    apply_model_settings(engine, args)
    if args.adapter and not mount_startup_adapter(engine, args.adapter):
        engine.close()  # the worker lets go of MLX before the interpreter's teardown
        return 2
    serve_forever(args, engine, sock)


def load_engine(args: argparse.Namespace, ssd: SsdConfig | None) -> Engine:
    """The chosen model loaded into an engine with the serve flags; a failure is said on
    stderr and raised as :class:`StartFailed`."""
    from .library.scan import scan
    from .models.resolve import ModelNotFound
    from .selection import report_selection_error

    resolved = resolve_chosen(args)  # before the engine's imports: a wrong name fails at once
    from . import loader
    from .engine.core import Engine
    from .engine.hlg import server_default
    from .engine.memory import DEFAULT_WAIT_S, MemoryConfig
    from .engine.speculate import SpecUnavailable
    from .experts import ExpertsUnsupported
    from .kvquant.probe import KVQuantUnavailable
    from .model import LoadOptions

    defaults = {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k) is not None}
    defaults["hlg"] = server_default(args)
    speculation = lookup_config(args)
    from .config.permodel import context_length
    from .models.window import WindowUnsupported

    try:
        options = LoadOptions(embedding=args.embedding, library=scan,
                              context_length=context_length(args, resolved.model_id),
                              model_id=resolved.model_id, extra={
            "draft_model": args.draft_model, "num_draft_tokens": args.num_draft_tokens or 3,
            "expert_budget": getattr(args, "expert_budget", None),
            "expert_offload": getattr(args, "expert_offload", False)})
        no_head: dict[str, Any] = {"predictor": None} if getattr(args, "mtp", None) == "off" \
            else {}
        return Engine.load(str(resolved.path), options, defaults=defaults, **no_head,
                           max_tokens=args.max_tokens or None,  # 0: no cap
                           speculation=speculation,
                           batch=args.batch, prompt_cache_bytes=int(args.prompt_cache * (1 << 30)),
                           ssd=ssd,
                           memory_budget_bytes=int(args.memory_budget * 1e9)
                           if args.memory_budget else None, kv_quant=args.kv_quant,
                           kv_budget_bytes=int(args.kv_budget * 1e9)
                           if getattr(args, "kv_budget", None) else None,
                           fill=getattr(args, "fill", None),
                           memory=MemoryConfig.from_config(wait_s=getattr(args, "memory_wait",
                                                                          DEFAULT_WAIT_S)))
    except ModelNotFound as exc:
        raise StartFailed(report_selection_error(exc)) from None
    except (loader.NoPluginClaimed, KVQuantUnavailable, SpecUnavailable,
            WindowUnsupported, ExpertsUnsupported) as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        raise StartFailed(2) from None
    except Exception as exc:  # a checkpoint mlx-lm cannot read, a plugin bug, …
        logging.getLogger("mlxbun").debug("load failed", exc_info=True)
        print(f"mlxbun: could not load {resolved.model_id}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        raise StartFailed(1) from None


def resolve_chosen(args: argparse.Namespace) -> ResolvedModel:
    """The chosen model found (a hub download or a GGUF conversion included) before the
    engine's imports (seconds of MLX and mlx-lm), so a wrong name, an offline hub or a
    file that is no GGUF is said at once; a failure is raised as :class:`StartFailed`."""
    from .library.scan import scan
    from .models.resolve import ModelNotFound, resolve_model
    from .selection import chosen_model, report_selection_error

    name = None
    try:
        name = chosen_model(args)
        return resolve_model(name, library=scan, progress=True)
    except ModelNotFound as exc:
        raise StartFailed(report_selection_error(exc)) from None
    except Exception as exc:  # a GGUF the converter cannot read, a full disk, …
        logging.getLogger("mlxbun").debug("resolve failed", exc_info=True)
        print(f"mlxbun: could not load {name or 'the default model'}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        raise StartFailed(1) from None


def lookup_config(args: argparse.Namespace) -> SpecConfig | None:
    """``--draft-kind ngram|mtp`` and its knobs (None: off); a bad combination is said on
    stderr and raised as :class:`StartFailed`."""
    from .engine.speculate import server_config

    mtp = getattr(args, "mtp", None)
    if mtp is not None and args.draft_kind not in (None, "mtp"):
        print(f"mlxbun: --mtp {mtp} and --draft-kind {args.draft_kind} pick different "
              "drafters: keep one", file=sys.stderr)
        raise StartFailed(2)
    if mtp == "off" and args.draft_kind == "mtp":
        print("mlxbun: --mtp off contradicts --draft-kind mtp", file=sys.stderr)
        raise StartFailed(2)
    if mtp == "on":
        args.draft_kind = "mtp"
    if args.draft_kind is None:
        return None
    if args.draft_model:
        print(f"mlxbun: --draft-kind {args.draft_kind} mounts no draft model: drop "
              "--draft-model", file=sys.stderr)
        raise StartFailed(2)
    try:
        return server_config(args.draft_kind, args.num_draft_tokens, args.ngram_max,
                             args.ngram_min)
    except ValueError as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        raise StartFailed(2) from None


def print_banner(args: argparse.Namespace, engine: Engine) -> str | None:
    """What is served, where, and on which BLAS; returns the web app's URL (None on a
    unix socket, or with the webapp plugin blocked)."""
    from . import plugins
    from .engine.warmup import describe as describe_warmup
    from .models.window import note as window_note
    from .webapp import NAME as WEBAPP
    from .webapp import pages as web

    model = engine.model
    fallback = " (no family plugin claimed it)" if model.family == "generic" else ""
    spec = f" · speculative with draft {engine.draft.name}" if engine.draft else ""
    if engine.speculation is not None and engine.predictor is not None \
            and engine.speculation.kind == "mtp":
        n = engine.speculation.num_draft_tokens or engine.predictor.num_draft_tokens
        spec = f" · MTP speculation ({n} drafts per round)"
    elif engine.speculation is not None:
        spec = f" · prompt-lookup speculation ({engine.speculation.num_draft_tokens} drafts)"
    where = f"unix:{args.unix}" if args.unix else f"http://{args.host}:{args.port}/v1"
    hosted = plugins.load_plugins().has_plugin(WEBAPP)
    page = web.page_url(args.host, args.port) if hosted and not args.unix else None
    how = window_note(model.extras.get("window"))
    print(f"mlxbun: serving {model.id} [{model.kind}] via plugin '{model.plugin}'{fallback}{spec}\n"
          f"        context {model.context_window} tokens{how} · {where}"
          + (f" · web app {page}" if page else ""), flush=True)
    if note := describe_warmup(engine.warmup):
        print(f"        {note}", flush=True)
    print_blas_line()
    return page


def serve_forever(args: argparse.Namespace, engine: Engine, sock: socket.socket | None, *,
                  on_app: Callable[[Any], None] | None = None,
                  on_exit: Callable[[int], int] | None = None) -> NoReturn:
    """Build the app, print the banner and serve until a drain; the process ends here.
    ``on_app`` may add to the app before it serves; ``on_exit`` runs after the drain and
    maps the exit status (a distributed serve stops its other ranks there)."""
    import uvicorn

    from .server.app import build_app
    from .server.drain import DrainingServer
    from .webapp import pages as web
    from .webapp import state as webapp_state

    app = build_app(engine, api_key=args.api_key, cors=cors_rules(args))
    settings = getattr(args, "settings", None)
    app.state.model_aliases = settings.aliases if settings is not None else {}
    if settings is not None and settings.file is not None:  # the web chat's MCP tools
        webapp_state.of(app).mcp_servers = settings.file.mcp_servers
    if on_app is not None:
        on_app(app)
    page = print_banner(args, engine)
    if args.unix:
        from .isolate.drain import DrainGate, exit_with_parent

        exit_with_parent()
        os.umask(0o077)  # the socket (and anything else this child writes) is ours alone
        app.state.trusts_injected_history = True  # only the --isolate parent reaches this socket
        if os.path.exists(args.unix):
            os.unlink(args.unix)  # a stale socket from a killed predecessor
        config = uvicorn.Config(DrainGate(app, engine), uds=args.unix, log_level="warning",
                                timeout_graceful_shutdown=10)
    else:
        from .server.connections import limits_from_args, uvicorn_settings

        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10,
                                **uvicorn_settings(limits_from_args(args), app))
    server = DrainingServer(config, engine)
    engine.on_fatal = server.fault  # a lost device: drain what it can, exit for a restart
    if page and engine.model.kind == "generate" and web.interactive_start(args.no_open):
        web.open_when_started(server, page)
    server.run(sockets=[sock] if sock else None)  # the address bound before the load
    # Served and drained (the worker has stopped and let go of MLX's per-thread state, so a
    # normal exit is clean too): nothing is left to save, so skip the interpreter's teardown
    # (module and native-library destructors) and keep any library's exit-time fault from
    # changing the status chosen here.
    status = server.exit_code if on_exit is None else on_exit(server.exit_code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # 0 after a drain; 128 + signal after a second signal


def print_blas_line() -> None:
    """The banner's BLAS line: which library MLX's CPU matrix products run on."""
    from . import blas

    print(f"        {blas.banner()}", flush=True)


def mount_startup_adapter(engine: Engine, where: str) -> bool:
    from pathlib import Path

    from .errors import APIError

    name = Path(where).expanduser().resolve().name
    try:
        engine.worker.run_sync(lambda: engine.adapters.mount(name, where, default=True))
    except APIError as exc:
        print(f"mlxbun: adapter {where}: {exc.message}", file=sys.stderr, flush=True)
        return False
    print(f"mlxbun: adapter {name} mounted and used by default (send \"adapter\": \"none\" "
          "for the base model)", flush=True)
    return True
