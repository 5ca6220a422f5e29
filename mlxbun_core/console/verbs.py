"""Small verbs and conventions of the ``mlxbun`` command: ``--version``, ``help [VERB]``,
``chat``'s flags, and bare ``mlxbun`` (no verb, or only options) meaning ``serve``."""

from __future__ import annotations

import argparse
import platform
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

ASKS_THE_COMMAND = {"-h", "--help", "--version", "-v"}
"""Options that belong to ``mlxbun`` itself: with one first, no verb is implied."""


def with_default_verb(argv: Sequence[str]) -> list[str]:
    """``argv`` with ``serve`` put first when it names no verb: nothing at all, or only
    options (``mlxbun --port 9000``). ``--help`` and ``--version`` still answer."""
    argv = list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ASKS_THE_COMMAND):
        return ["serve", *argv]
    return argv


def version_text() -> str:
    """``mlxbun --version``: ours, then what a bug report needs next to it."""
    from .. import __version__

    parts = [f"mlxbun {__version__}"]
    for dist in ("mlx", "mlx-lm"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
    parts.append(f"Python {platform.python_version()} ({platform.system()} "
                 f"{platform.machine()})")
    return " · ".join(parts)


class VersionAction(argparse.Action):
    """``--version``: the text is looked up only when asked for."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(version_text())
        parser.exit()


def add_version_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--version", "-v", action=VersionAction, nargs=0,
                   help="print the versions of mlxbun, MLX and mlx-lm, then exit")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``mlxbun help [VERB]`` and ``mlxbun chat [MODEL]``."""
    h = sub.add_parser("help", help="this overview, or one verb's flags (mlxbun help serve)")
    h.add_argument("verb", nargs="?", default=None)
    c = sub.add_parser("chat", help="chat in the terminal with a served model (finds a "
                                    "running server, or starts one for the session)")
    c.add_argument("positional", nargs="?", default=None, metavar="model",
                   help="the model to chat with (as `mlxbun serve` takes it; default: "
                        "what the running server serves, else the embedded default)")
    c.add_argument("--url", default=None,
                   help="a server to use (http://HOST:PORT); it must be running")
    c.add_argument("--host", default="127.0.0.1", help="where to look for a running "
                   "server (default: %(default)s)")
    c.add_argument("--port", type=int, default=None,
                   help="its port (default: MLXBUN_PORT, else 8080)")
    c.add_argument("--system", default=None, metavar="TEXT", help="a system prompt")
    c.add_argument("--max-tokens", type=int, default=None,
                   help="cap each reply (default: the server's default cap)")
    c.add_argument("--temperature", type=float, default=None)


def cmd_help(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """The overview, or ``VERB``'s full help (as ``mlxbun VERB --help`` prints it)."""
    if args.verb is None:
        parser.print_help()
        return 0
    verbs = subcommands(parser)
    if args.verb not in verbs:
        print(f"mlxbun: no verb {args.verb!r}; verbs: {', '.join(sorted(verbs))}",
              file=sys.stderr)
        return 2
    verbs[args.verb].print_help()
    return 0


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
