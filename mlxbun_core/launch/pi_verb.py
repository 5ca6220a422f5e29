"""``mlxbun pi``: the reference's verb in front of ``mlxbun launch pi`` (its few flags map
onto pi's own; serve flags pick the session server; anything after ``--`` goes to pi)."""

from __future__ import annotations

import argparse
import os
import stat
import sys

PI_FLAGS_HELP = """\
mlxbun pi [SERVE FLAGS] [-p] [--json] [--mode json|rpc|text] [--verbose] [PROMPT...] [-- PI ARGS]

Run the pi coding agent against mlxbun (`mlxbun launch pi` underneath): a server the serve
flags point at is used, or one is started for the session and stopped after it.

  PROMPT...           the first turn (interactive), or the message with -p
  -p, --print         one-shot: print the reply and exit (piped stdin makes it one-shot too)
  --json              with -p: pi's full event stream as JSON lines (pi --mode json)
  --mode MODE         json, rpc (JSONL RPC over stdio) or text (= -p)
  --verbose           pi's verbose start-up
  SERVE FLAGS         every `mlxbun serve` flag (-q/--model/--port/...): the session server's
  -- PI ARGS          anything after -- goes to pi as typed (--continue, --tools, ...)
"""


class PiArgsError(ValueError):
    """A word ``mlxbun pi`` does not take."""


def serve_option_arity(flag: str) -> int | None:
    """How many values the serve flag ``flag`` takes after it (None: not a serve flag)."""
    from ..serve_flags import add_serve_parser

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    add_serve_parser(sub)
    name = flag.split("=", 1)[0]
    action = next((a for a in sub.choices["serve"]._actions if name in a.option_strings), None)
    if action is None:
        return None
    return 0 if "=" in flag or action.nargs == 0 else 1


def split_pi_args(words: list[str], stdin_piped: bool) -> tuple[list[str], list[str]]:
    """``mlxbun pi`` words → ``(serve flags, pi args)``."""
    flags: list[str] = []
    pi: list[str] = []
    prompt: list[str] = []
    one_shot = False
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            pi += words[i + 1:]
            break
        if word in ("-p", "--print"):
            one_shot = True
        elif word == "--json":
            pi += ["--mode", "json"]
        elif word == "--mode" or word.startswith("--mode="):
            value = word.split("=", 1)[1] if "=" in word else _value(words, i)
            if value not in ("json", "rpc", "text"):
                raise PiArgsError(f"--mode takes json, rpc or text, not {value!r}")
            one_shot = one_shot or value == "text"
            pi += ["--mode", value] if value != "text" else []
            i += "=" not in word
        elif word == "--verbose":
            pi.append(word)
        elif word.startswith("-") and word != "-":
            arity = serve_option_arity(word)
            if arity is None:
                raise PiArgsError(f"{word} is neither an `mlxbun pi` nor an `mlxbun serve` "
                                  "flag; pass pi's own flags after --")
            flags += words[i:i + 1 + arity]
            i += arity
        else:
            prompt.append(word)
        i += 1
    if stdin_piped and "--mode" not in pi:
        one_shot = True
    return flags, (["-p"] if one_shot else []) + pi + ([" ".join(prompt)] if prompt else [])


def _value(words: list[str], i: int) -> str:
    if i + 1 >= len(words):
        raise PiArgsError(f"{words[i]} needs a value")
    return words[i + 1]


def stdin_is_piped() -> bool:
    """A pipe or a file on stdin (``git diff | mlxbun pi``), not a terminal or /dev/null."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode)


def cmd_pi(words: list[str]) -> int:
    """``mlxbun pi WORDS``: split, then ``mlxbun launch pi``; ``--help`` alone is ours."""
    from . import launch_client

    if words in (["--help"], ["-h"]):
        print(PI_FLAGS_HELP, end="")
        return 0
    try:
        flags, pi_args = split_pi_args(words, stdin_is_piped())
    except PiArgsError as exc:
        print(f"mlxbun pi: {exc}", file=sys.stderr)
        return 2
    return launch_client("pi", flags, pi_args)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """``mlxbun pi`` and ``mlxbun harness pi``."""
    from .pi_harness import add_parser as add_harness_parser

    p = sub.add_parser("pi", help="the pi coding agent against mlxbun (starts a server if "
                                   "none answers, stops it after)",
                       description=PI_FLAGS_HELP, add_help=False,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("words", nargs=argparse.REMAINDER, metavar="[PROMPT|FLAGS]")
    add_harness_parser(sub)
