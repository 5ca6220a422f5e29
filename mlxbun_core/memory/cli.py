"""``mlxbun memory``: init, status, list, search, read, toc, section, links, open, link,
synthesize and schedule / unschedule from a terminal.

The same vault and synthesis the server's routes use. ``synthesize`` loads the model itself
(``--model``, default: the embedded one) unless ``--dry-run``, which needs none. The saved
sessions come from the caller (``cli.py`` hands in the web chat's reader), so this room
knows nothing of the web chat.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import APIError
from . import schedule
from .synthesis import Conversation, Synthesis
from .vault import Vault

Conversations = Callable[[Path | None], list[Conversation]]
STAGES = ("segment", "extract", "route", "synthesize-stage")
NO_STAGES = ("the synthesis here is one pass, not a DAG of resumable stage workers: run "
             "`mlxbun memory synthesize` (--dry-run to plan, --force to reread conversations)")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    m = sub.add_parser("memory", help="the memory vault: articles written from saved chats")
    m.add_argument("--root", type=Path, default=None,
                   help="the vault folder (default: $MLXBUN_WIKI or <mlxbun home>/memory)")
    msub = m.add_subparsers(dest="memory_command")
    msub.add_parser("init", aliases=["setup"], help="create the vault (idempotent) and index it")
    msub.add_parser("status", help="where it is, how many articles")
    msub.add_parser("list", help="article names and reference documents")
    s = msub.add_parser("search", help="search the vault")
    s.add_argument("query", nargs="+")
    s.add_argument("--limit", type=int, default=20)
    for name, text in (("read", "print an article"), ("links", "an article's wikilinks"),
                       ("toc", "an article's headings and their anchors")):
        msub.add_parser(name, help=text).add_argument("article")
    sec = msub.add_parser("section", help="print one section of an article, by its anchor")
    sec.add_argument("article")
    sec.add_argument("anchor", help="as `toc` lists it (the heading's words, lower case, "
                                    "joined by -)")
    o = msub.add_parser("open", aliases=["browse"], help="open the vault, or one article, "
                        "with the system's opener (prints the path too)")
    o.add_argument("article", nargs="?", default=None)
    k = msub.add_parser("link", help="link first mentions of other articles and rebuild "
                        "See also (no model)")
    k.add_argument("--limit", type=int, default=None, help="at most this many articles")
    y = msub.add_parser("synthesize", aliases=["pipeline", "all"],
                        help="saved chats -> articles, with the model")
    y.add_argument("--dry-run", action="store_true", help="plan only: no model, no writes")
    y.add_argument("--force", action="store_true", help="reread conversations already read")
    y.add_argument("--model", default=None, help="model to synthesize with (default: embedded)")
    y.add_argument("--sessions", type=Path, default=None,
                   help="the sessions folder (default: the web chat's)")
    for name in STAGES:  # the reference's stage workers: parsed, then refused with why
        w = msub.add_parser(name)
        w.add_argument("--limit", type=int, default=None)
        w.add_argument("--convs", default=None)
    schedule.add_parsers(msub)


def cmd_memory(args: argparse.Namespace, conversations: Conversations) -> int:
    vault = Vault(args.root)
    command = {"setup": "init", "pipeline": "synthesize", "all": "synthesize",
               "browse": "open"}.get(args.memory_command, args.memory_command or "status")
    if command in STAGES:
        print(f"mlxbun: memory {command}: refused: {NO_STAGES}", file=sys.stderr)
        return 2
    try:
        if command == "init":
            _print(vars(vault.setup()))
        elif command == "synthesize":
            return _synthesize(vault, args, conversations)
        elif command in ("schedule", "unschedule"):
            return schedule.cmd_schedule(vault, args, add_parsers) if command == "schedule" else (
                schedule.cmd_unschedule())
        elif command in ("open", "link"):
            from .verbs import cmd_link, cmd_open

            vault.require()
            return cmd_open(vault, args.article) if command == "open" else cmd_link(
                vault, args.limit)
        else:
            vault.require()
            _print(_read_command(vault, command, args))
    except APIError as exc:
        print(f"mlxbun: {exc.message} ({vault.root})", file=sys.stderr)
        return 1 if exc.status == 404 else 2
    return 0


def _read_command(vault: Vault, command: str, args: argparse.Namespace) -> Any:
    if command == "status":  # the reference's status says whether the job is installed too
        return {**vault.status(), "schedule": [entry for _, entry in schedule.installed()]}
    if command == "list":
        return {"articles": vault.article_names(), "reference": vault.reference_ids()}
    if command == "search":
        return vault.search(" ".join(args.query), "all", args.limit)
    if command == "links":
        return vault.links(args.article)
    if command in ("toc", "section"):
        from .verbs import section, toc

        return toc(vault, args.article) if command == "toc" else section(
            vault, args.article, args.anchor)
    return vault.read(args.article)  # read


def _print(value: Any) -> None:
    print(value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False))


def _synthesize(vault: Vault, args: argparse.Namespace, conversations: Conversations) -> int:
    vault.require()
    convs = conversations(args.sessions)
    engine = None
    if not args.dry_run:
        from ..engine.core import Engine

        try:
            engine = Engine.load(args.model, progress=False)
        except Exception as exc:  # any load failure is the user's to read, not a traceback
            print(f"mlxbun: cannot load the model: {exc}", file=sys.stderr)
            return 2
    job = Synthesis(vault, engine, convs, dry=args.dry_run, force=args.force)

    async def run() -> int:
        async for event in job.run():
            stage = f"[{event['stage']}] " if event["type"] == "stage" else ""
            print(f"{event['type']}: {stage}{event.get('message') or event.get('note', '')}",
                  flush=True)
        return 0

    try:
        code = asyncio.run(run())
    except (APIError, RuntimeError) as exc:
        print(f"mlxbun: synthesis failed: {exc}", file=sys.stderr)
        code = 1
    if engine is None:
        return code
    engine.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown under MLX's native threads (it aborts there)
