"""``mlxbun generate`` (``gen``): one prompt to text on stdout, streamed as it is made, through
the engine in this process (no server). The prompt goes through the chat template unless
``--raw``; a prompt of ``-`` is read from stdin (as ``mlx_lm.generate`` reads it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..serve_flags import add_selection_flags
from .oneshot import verb_parser


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verb_parser(sub, "generate", aliases=["gen"],
                       help="one prompt to text on stdout through a local model, no server")
    p.add_argument("words", nargs="*", metavar="[model] prompt",
                   help="the model (unless --model/--query names it), then the prompt; "
                        "`-` reads the prompt from stdin")
    add_selection_flags(p)
    p.add_argument("--prompt", default=None, help="the prompt (instead of the positional)")
    p.add_argument("--system", default=None, metavar="TEXT", help="a system prompt")
    p.add_argument("--raw", action="store_true", help="skip the chat template")
    p.add_argument("--max-tokens", type=int, default=256,
                   help="completion cap (default: %(default)s)")
    p.add_argument("--temperature", "--temp", dest="temperature", type=float, default=None,
                   help="sampling temperature (default: the model's, else 0: greedy)")
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--json", action="store_true",
                   help="one JSON object at the end (text, finish_reason, usage) instead of "
                        "streamed text")
    p.set_defaults(handler=cmd_generate)


def split_words(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """``(model, prompt)`` from the positionals: with ``--model``/``--query`` or ``--prompt``
    given, one positional is the other of the two; otherwise model first, then prompt."""
    words = list(args.words)
    if len(words) > 2:
        raise ValueError("at most two positionals: [model] prompt (quote the prompt)")
    named = bool(args.model or args.query)
    if args.prompt is not None:
        if named and words:
            raise ValueError("the prompt is given twice (--prompt and a positional)")
        return (words[0] if words else None), args.prompt
    if named or len(words) < 2:
        if named and len(words) > 1:
            raise ValueError("--model/--query names the model: one positional, the prompt")
        return None, (words[0] if words else None)
    return words[0], words[1]


def read_prompt(prompt: str | None) -> str:
    if prompt == "-":
        return sys.stdin.read()
    if not prompt:
        raise ValueError("no prompt: pass one, --prompt TEXT, or `-` to read stdin")
    return prompt


def request_body(args: argparse.Namespace, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": args.max_tokens}
    for key in ("temperature", "top_p", "top_k", "seed"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.raw:
        if args.system is not None:
            raise ValueError("--system needs the chat template (drop --raw)")
        return {**body, "prompt": prompt}
    system = [{"role": "system", "content": args.system}] if args.system else []
    return {**body, "messages": [*system, {"role": "user", "content": prompt}]}


def cmd_generate(args: argparse.Namespace) -> int:
    from ..errors import APIError
    from ..models.resolve import ModelNotFound
    from ..selection import chosen_model, report_selection_error, resolve

    try:
        positional, text = split_words(args)
        args.positional = positional
        body = request_body(args, read_prompt(text))
        resolved = resolve(chosen_model(args), progress=False)
    except ValueError as exc:
        print(f"mlxbun generate: {exc}", file=sys.stderr)
        return 2
    except ModelNotFound as exc:
        return report_selection_error(exc)
    try:
        return asyncio.run(run(str(resolved.path), resolved.model_id, body, args.raw, args.json))
    except APIError as exc:
        print(f"mlxbun generate: {exc.message}", file=sys.stderr)
        return 1


async def run(path: str, model_id: str, body: dict[str, Any], raw: bool, as_json: bool) -> int:
    """Load, generate once, print; 1 when the generation failed."""
    from ..engine.core import Engine
    from ..events import Content, Done, Reasoning
    from ..library.scan import scan
    from ..model import LoadOptions

    engine = Engine.load(path, LoadOptions(model_id=model_id, library=scan), progress=False,
                         batch=1, prompt_cache_bytes=0)
    try:
        req = engine.parse_completion(body) if raw else engine.parse_chat(body)
        gen = await engine.start(req)
        parts: list[str] = []
        reasoning: list[str] = []
        finish = None
        async for ev in gen.events():
            if isinstance(ev, Content):
                parts.append(ev.text)
                if not as_json:
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
            elif isinstance(ev, Reasoning):
                reasoning.append(ev.text)
                if not as_json:
                    sys.stderr.write(ev.text)
            elif isinstance(ev, Done):
                finish = ev.finish
    finally:
        engine.close()
    if finish is None or finish.failed:
        print(f"mlxbun generate: {finish.error if finish else 'no result'}", file=sys.stderr)
        return 1
    if as_json:
        out = {"model": model_id, "text": "".join(parts), "finish_reason": finish.reason,
               "usage": finish.usage.openai()}
        if reasoning:
            out["reasoning"] = "".join(reasoning)
        print(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
    return 0
