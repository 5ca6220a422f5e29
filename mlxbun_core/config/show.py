"""``mlxbun config show [SERVE FLAGS]``: the settings ``mlxbun serve`` would run with, and
where each came from (``flag``, ``env NAME``, ``file:PATH:LINE`` or ``default``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .duration import describe
from .effective import ParserFactory, Settings, apply_config
from .runtime import build, report
from .schema import serve_options
from .yamlfile import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("config", help="the effective serve settings and where each came from")
    c.add_argument("action", choices=("show",))
    c.add_argument("--json", action="store_true", help="one JSON object")
    c.add_argument("serve_args", nargs=argparse.REMAINDER, metavar="SERVE FLAGS",
                   help="serve flags to take into account, as `mlxbun serve` would get them")


def cmd_config(args: argparse.Namespace, factory: ParserFactory) -> int:
    rest = list(args.serve_args)
    as_json = args.json or "--json" in rest  # REMAINDER takes it when it comes after `show`
    argv = ["serve", *(a for a in rest if a != "--json")]
    try:
        serve = factory().parse_args(argv)
        settings = apply_config(serve, argv, factory)
    except ConfigError as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return 2
    try:
        shown = effective_report(serve, settings, factory)
    except ValueError as exc:  # a variable of the run configuration with a wrong value
        print(f"mlxbun: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(shown, indent=1, default=str))
        return 0
    print(text_report(shown))
    return 0


def _shown(value: Any) -> Any:
    if isinstance(value, float) and value == float("inf"):
        return "forever"
    return value


def effective_report(args: argparse.Namespace, settings: Settings,
                     factory: ParserFactory) -> dict[str, Any]:
    """Settings as data: ``serve`` (value and source per key), ``runtime`` (the run
    configuration serve would install, by group), ``aliases``, ``models``."""
    serve = {}
    for key, opt in serve_options(factory()).items():
        value = getattr(args, key, None)
        if key == "api_key" and value:
            value = "(set)"  # never printed
        serve[key] = {"value": _shown(value), "source": settings.sources.get(key, "default"),
                      "flag": opt.flag}
    file = settings.file
    runtime = report(build(args), settings.sources)
    aliases: dict[str, Any] = {}
    models: dict[str, Any] = {}
    if file is None:
        return {"config_file": None, "serve": serve, "runtime": runtime, "aliases": aliases,
                "models": models}
    aliases = {k: {"model": v.value, "source": f"file:{file.path}:{v.line}"}
               for k, v in file.aliases.items()}
    for name, m in file.models.items():
        row: dict[str, Any] = dict(m.sampling)
        if m.max_tokens is not None:
            row["max_tokens"] = m.max_tokens
        if m.template_kwargs:
            row["chat_template_kwargs"] = m.template_kwargs
        if m.keep_alive is not None:
            row["keep_alive"] = describe(m.keep_alive)
        models[name] = {"settings": row, "source": f"file:{file.path}:{m.line}",
                        "model": settings.resolve(name)}
    return {"config_file": str(file.path), "serve": serve, "runtime": runtime,
            "aliases": aliases, "models": models}


def text_report(report: dict[str, Any]) -> str:
    lines = [f"config file: {report['config_file'] or '(none)'}", "serve:"]
    width = max(len(k) for k in report["serve"])
    for key, row in report["serve"].items():
        value = json.dumps(row["value"], default=str)
        lines.append(f"  {key:<{width}}  {value:<24} {row['source']}")
    for group, rows in report.get("runtime", {}).items():
        lines.append(f"{group}:")
        for key, row in rows.items():
            value = json.dumps(row["value"], default=str)
            lines.append(f"  {key:<{width}}  {value:<24} {row['source']}")
    if report["aliases"]:
        lines.append("aliases:")
        for name, row in report["aliases"].items():
            lines.append(f"  {name} -> {row['model']}  {row['source']}")
    if report["models"]:
        lines.append("models:")
        for name, row in report["models"].items():
            target = f" ({row['model']})" if row["model"] != name else ""
            lines.append(f"  {name}{target}: {json.dumps(row['settings'])}  {row['source']}")
    return "\n".join(lines)
