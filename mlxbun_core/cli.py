"""The ``mlxbun`` command: serve a model, list plugins, convert GGUF files."""

from __future__ import annotations

import argparse
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
    s.add_argument("model", nargs="?", default=None,
                   help="local dir, Hugging Face repo id or .gguf file "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    s.add_argument("--host", default=os.environ.get("MLXBUN_HOST", "127.0.0.1"))
    s.add_argument("--port", type=int, default=int(os.environ.get("MLXBUN_PORT", "8080")))
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
    s.add_argument("--batch", type=_positive_int, default=int(os.environ.get("MLXBUN_BATCH", "8")),
                   help="rows decoded together by continuous batching (default 8; 1 pins serial)")
    s.add_argument("--prompt-cache", type=float, metavar="GB",
                   default=float(os.environ.get("MLXBUN_PROMPT_CACHE", "8")),
                   help="prefix KV cache size in GiB (default 8; 0 turns it off)")
    s.add_argument("--memory-budget", type=float, metavar="GB", default=None,
                   help="memory the model, its KV and prefill may use, in GB (10^9 bytes); "
                        "sets max_safe_context and row admission (default: what MLX reports)")
    s.add_argument("--api-key", default=os.environ.get("MLXBUN_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on every route; admin routes "
                        "then also answer remote clients (default: no key, admin loopback-only)")
    s.add_argument("--grammar-backend", default=None,
                   help="structured-output backend (llguidance, xgrammar)")
    s.add_argument("--allow-private-media", action="store_true",
                   default=os.environ.get("MLXBUN_ALLOW_PRIVATE_MEDIA", "").lower()
                   in ("1", "true", "yes", "on"),
                   help="let image/audio/video URLs reach private, loopback and link-local "
                        "hosts (a NAS on the LAN); refused by default")
    s.add_argument("--log-level", default=os.environ.get("MLXBUN_LOG_LEVEL", "info"))

    sub.add_parser("plugins", help="list installed plugins and the hooks they implement")

    c = sub.add_parser("convert", help="convert a GGUF file to an MLX checkpoint directory")
    c.add_argument("gguf")
    c.add_argument("out")
    return p


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


def cmd_serve(args) -> int:
    import uvicorn

    from . import loader
    from .engine.core import Engine
    from .model import LoadOptions
    from .models.resolve import ModelNotFound
    from .server.app import build_app
    from .server.drain import DrainingServer

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    if args.grammar_backend:
        from .grammar import registry

        try:
            registry.select(args.grammar_backend)
        except ValueError as exc:
            print(f"mlxbun: {exc}", file=sys.stderr)
            return 2
    configure_media(args)
    defaults = {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k) is not None}
    try:
        options = LoadOptions(embedding=args.embedding, extra={
            "draft_model": args.draft_model, "num_draft_tokens": args.num_draft_tokens})
        engine = Engine.load(args.model, options, defaults=defaults, max_tokens=args.max_tokens,
                             batch=args.batch, prompt_cache_bytes=int(args.prompt_cache * (1 << 30)),
                             memory_budget_bytes=int(args.memory_budget * 1e9)
                             if args.memory_budget else None)
    except (ModelNotFound, loader.NoPluginClaimed) as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a checkpoint mlx-lm cannot read, a plugin bug, …
        logging.getLogger("mlxbun").debug("load failed", exc_info=True)
        print(f"mlxbun: could not load {args.model or 'the default model'}: "
              f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    model = engine.model
    app = build_app(engine, api_key=args.api_key)
    fallback = " (no family plugin claimed it)" if model.family == "generic" else ""
    spec = f" · speculative with draft {engine.draft.name}" if engine.draft else ""
    print(f"mlxbun: serving {model.id} [{model.kind}] via plugin '{model.plugin}'{fallback}{spec}\n"
          f"        context {model.context_window} tokens · http://{args.host}:{args.port}/v1",
          flush=True)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                            timeout_graceful_shutdown=10)
    DrainingServer(config, engine).run()
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return {"serve": cmd_serve, "plugins": cmd_plugins, "convert": cmd_convert}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
