"""The ``mlxbun`` command: serve a model (also bare ``mlxbun``), list local models, assess
fit, list plugins, convert checkpoints and GGUF files, chat in the terminal (``console/``);
plugins add verbs through ``register_commands`` (the web app: ``train``, ``quantize``,
``memory``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Sequence

from .console import bench as bench_verb
from .console import cache_verb, dictate, transcribe
from .console import convert as convert_verb
from .console import embed as embed_verb
from .console import generate as generate_verb
from .console import perplexity as perplexity_verb
from .console import verbs as console_verbs
from .console.pipes import quiet_on_closed_pipe
from .serve_flags import add_kv_quant_flag, add_selection_flags, add_serve_parser, byte_size


def build_parser(plugin_verbs: bool = True) -> argparse.ArgumentParser:
    """Every verb's parser; without ``plugin_verbs``, the core's alone (no plugin loads)."""
    p, sub = _core_parser()
    if plugin_verbs:
        add_plugin_verbs(sub)
    return p


def add_plugin_verbs(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The verbs plugins add (the web app's, installed plugins'): this loads every plugin."""
    from . import plugins

    plugins.hook().register_commands(subparsers=sub)


def wants_plugin_verbs(argv: Sequence[str], core_verbs: Collection[str]) -> bool:
    """Whether ``argv`` (its verb first) needs the plugins' verbs: the overall help lists
    them, and a verb that is no core one is a plugin's (or a typo, whose error lists them
    all). A core verb or ``--version`` starts without loading a plugin."""
    first = argv[0] if argv else ""
    if first in ("-h", "--help", "help"):
        return True
    return not first.startswith("-") and first not in core_verbs


def _core_parser() -> tuple[argparse.ArgumentParser,
                            argparse._SubParsersAction[argparse.ArgumentParser]]:
    p = argparse.ArgumentParser(prog="mlxbun", description="LLM inference server on MLX "
                                "(no verb, or only serve's options: serve)")
    console_verbs.add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)

    ls = sub.add_parser("ls", help="list local models (HF cache and converted models)")
    ls.add_argument("filter", nargs="?", default=None, help="case-insensitive id substring")
    ls.add_argument("--json", action="store_true", help="one JSON object per line")
    ls.add_argument("--all-revisions", action="store_true",
                    help="one row per cached snapshot (the canonical one marked *)")
    ls.add_argument("--vision", action="store_true", help="only models that take images")
    ls.add_argument("--max-size", type=byte_size, default=None, metavar="SIZE",
                    help="only models at most this big on disk (10GB, 512MB; a bare number: GB)")

    f = sub.add_parser("fit", help="will a model fit this machine: memory plan and decode rate")
    f.add_argument("positional", nargs="?", default=None, metavar="model")
    add_selection_flags(f)
    f.add_argument("--ctx", type=int, default=None, help="context length to assess")
    add_kv_quant_flag(f, default="off", alias="--kv-bits", extra=("config",))
    f.add_argument("--skus", action="store_true",
                   help="also the Apple silicon lineup: fits, max context, decode rate each")
    f.add_argument("--memory-budget", type=float, default=None, metavar="GB",
                   help="assess against this budget instead of the machine's usable memory")
    f.add_argument("--ranks", type=int, default=1, metavar="N",
                   help="assess one rank's share of a --distributed serve over N ranks")
    f.add_argument("--pipeline", action="store_true",
                   help="with --ranks: pipeline parallel (layers split) instead of tensor")
    f.add_argument("--measure", action="store_true",
                   help="measure the decode bandwidth again (it is measured once and remembered)")
    f.add_argument("--json", action="store_true")

    sub.add_parser("plugins", help="list installed plugins and the hooks they implement")

    convert_verb.add_parser(sub)

    from .config.show import add_parser as add_config_parser
    from .hub import cli as hub_cli
    from .launch import add_parser as add_launch_parser
    from .launch.pi_verb import add_parsers as add_pi_parsers

    add_config_parser(sub)
    add_launch_parser(sub)
    add_pi_parsers(sub)  # `pi`, `harness pi`
    hub_cli.add_parsers(sub)
    console_verbs.add_parsers(sub)
    cache_verb.add_parsers(sub)
    transcribe.add_parser(sub)
    dictate.add_parser(sub)
    generate_verb.add_parser(sub)
    embed_verb.add_parser(sub)
    perplexity_verb.add_parser(sub)
    bench_verb.add_parsers(sub)
    return p, sub


def build_serve_parser() -> argparse.ArgumentParser:
    """Just ``mlxbun serve`` (what the config file's keys and sources are read from)."""
    p = argparse.ArgumentParser(prog="mlxbun")
    add_serve_parser(p.add_subparsers(dest="command", required=True))
    return p


def cmd_ls(args: argparse.Namespace) -> int:
    import json

    from .library.fit import machine
    from .library.report import assessment, ls_table
    from .library.scan import scan

    if args.all_revisions:
        from .hub.cli import all_revisions, print_revisions

        rows = all_revisions(args.filter)
        for row in rows if args.json else ():
            print(json.dumps(row))
        if not args.json:
            print_revisions(rows)
        return 0
    entries = [e for e in scan() if (not args.filter or args.filter.lower() in e.id.lower())
               and (e.vision or not args.vision)
               and (args.max_size is None or e.size_bytes <= args.max_size)]
    m = machine()
    if args.json:
        for e in entries:
            print(json.dumps({**e.row(), "assessment": assessment(e, m)}))
    elif entries:
        print(ls_table(entries, m))
    else:
        print("no local models" + (f" matching {args.filter!r}" if args.filter else ""))
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    import json

    from .library import checkpoint
    from .library.fit import machine
    from .library.report import fit_report, fit_text, sku_text
    from .models.resolve import ModelNotFound
    from .selection import chosen_model, report_selection_error, resolve

    try:
        resolved = resolve(chosen_model(args), progress=True)
    except ModelNotFound as exc:
        return report_selection_error(exc)
    if args.measure:
        from .library.bandwidth import forget

        forget()
    config = checkpoint.read_json(resolved.path / "config.json")
    budget = int(args.memory_budget * 1e9) if args.memory_budget else None
    weights, per_rank = checkpoint.weights(resolved.path), None
    if args.ranks > 1:  # one rank's share of a --distributed serve
        from .library.ranks import rank_config, rank_weight_bytes, replicated_bytes

        mode = "pipeline" if args.pipeline else "tensor"
        per_rank = rank_weight_bytes(weights.total_bytes,
                                     replicated_bytes(config, weights.dtypes), args.ranks)
        config = rank_config(config, args.ranks, mode)
    try:
        kv_bits = fit_kv_bits(args.kv_quant, resolved.path, config)
    except ValueError as exc:
        print(f"mlxbun: fit: {exc}", file=sys.stderr)
        return 2
    r = fit_report(config, weights, machine(), context=args.ctx, budget_bytes=budget,
                   kv_bits=kv_bits, weights_bytes=per_rank)
    if args.ranks > 1:
        r["ranks"] = {"count": args.ranks, "mode": "pipeline" if args.pipeline else "tensor",
                      "weights_bytes_per_rank": per_rank}
    if args.json:
        print(json.dumps({"model": resolved.model_id, **r}))
        return 0
    print(fit_text(resolved.model_id, r))
    if args.skus:
        print(sku_text(r))
    if args.ranks > 1:
        print(f"  per rank          1 of {args.ranks} ranks ({r['ranks']['mode']} parallel): "
              "weights and KV above are one machine's share")
    return 0


def fit_kv_bits(kv_quant: str, model_dir, config: dict):
    """``--kv-quant`` as ``fit`` bills it: uniform bits, or ``config``'s per-layer bits."""
    from .kvquant import parse
    from .library import kv_config
    from .library.fit import text_config

    if kv_quant != "config":
        return parse(kv_quant).bits
    return kv_config.read(model_dir, int(text_config(config).get("num_hidden_layers") or 0))


def cmd_plugins(args: argparse.Namespace) -> int:
    from . import __version__, plugins

    for row in plugins.describe():
        if row["source"] == "builtin":
            origin = f"built into mlxbun {__version__}"
        else:
            parts = (row.get("distribution"), row.get("version"))
            origin = " ".join(x for x in parts if x) or row["source"]
        status = f"  FAILED: {row['error']}" if row["error"] else ""
        family = f" · family {row['family']}" if row.get("family") else ""
        print(f"{row['name']} ({origin}){family}{status}")
        if row["hooks"]:
            print("  hooks: " + ", ".join(row["hooks"]))
    return 0


@quiet_on_closed_pipe
def main(argv: Sequence[str] | None = None) -> int:
    own_process = argv is None  # the command line, not a caller's argv (tests run main in-process)
    argv = console_verbs.with_default_verb(sys.argv[1:] if argv is None else argv)
    if argv[0] == "pi":  # its words mix pi's flags, serve's and a prompt: parsed there
        from .launch.pi_verb import cmd_pi

        return cmd_pi(argv[1:])
    parser, verbs = _core_parser()
    if wants_plugin_verbs(argv, verbs.choices):
        add_plugin_verbs(verbs)
    args = parser.parse_args(argv)
    if args.command == "serve":
        from .config import ConfigError, apply_config

        try:
            settings = apply_config(args, argv, build_serve_parser)
        except ConfigError as exc:
            print(f"mlxbun: {exc}", file=sys.stderr)
            return 2
        from .serve_switches import fold_aliases

        fold_aliases(args, settings.sources)
    if own_process:
        from .torchless import keep_torch_out

        keep_torch_out(getattr(args, "grammar_backend", None))  # seconds that nothing uses
    if args.command == "serve":
        if args.distributed:  # every rank of an mlx.launch group
            from .dist_serve import serve_distributed

            return serve_distributed(args)
        from .startup import cmd_serve

        return cmd_serve(args, parser)
    if args.command == "launch":
        from .launch import cmd_launch

        return cmd_launch(args, argv)
    if args.command == "config":
        from .config.show import cmd_config

        return cmd_config(args, build_serve_parser)
    if callable(getattr(args, "handler", None)):  # a verb a plugin registered
        status: int = args.handler(args)
        return status
    if args.command in ("chat", "help"):
        from .console.chat import cmd_chat

        return cmd_chat(args) if args.command == "chat" else console_verbs.cmd_help(args, parser)
    from .hub import cli as hub_cli

    return {"plugins": cmd_plugins, "convert": convert_verb.cmd_convert, "ls": cmd_ls,
            "fit": cmd_fit, "download": hub_cli.cmd_download, "get": hub_cli.cmd_download,
            "upload": hub_cli.cmd_upload, "gc": hub_cli.cmd_gc, "scan": hub_cli.cmd_scan,
            "cache": cache_verb.cmd_cache}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
