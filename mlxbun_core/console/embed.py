"""``mlxbun embed``: text embeddings from a local embedding model (Qwen3-Embedding), no
server. The vectors are the ones ``POST /v1/embeddings`` answers: the same plugin hook, the
same instruction format. One JSON array per text, or with ``--json`` one OpenAI-style list."""

from __future__ import annotations

import argparse
import json
import sys

from ..serve_flags import add_selection_flags
from .oneshot import verb_parser


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verb_parser(sub, "embed", help="text embeddings from a local embedding model, no server")
    p.add_argument("words", nargs="*", metavar="[model] text",
                   help="the model (unless --model/--query names it), then a text; with no "
                        "text (and no --text), one text per stdin line")
    add_selection_flags(p)
    p.add_argument("--text", action="append", default=None,
                   help="a text to embed (repeatable)")
    p.add_argument("--instruct", default=None, metavar="TEXT",
                   help="the query instruction (Qwen3-Embedding's `Instruct: …\\nQuery:`); "
                        "omit for plain document embeddings")
    p.add_argument("--json", action="store_true",
                   help="one {object: list, data: [...], usage} object instead of bare arrays")
    p.set_defaults(handler=cmd_embed)


def texts_and_model(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """``(model positional, texts)``: a positional text only when no --text is given."""
    words = list(args.words)
    named = bool(args.model or args.query)
    if args.text:
        if len(words) > (0 if named else 1):
            raise ValueError("texts come from --text or a positional, not both")
        return (words[0] if words else None), list(args.text)
    if named:
        model, rest = None, words
    else:
        model, rest = (words[0] if words else None), words[1:]
    if len(rest) > 1:
        raise ValueError("one positional text at most (use --text repeatedly, or stdin)")
    if rest:
        return model, rest
    lines = [line.rstrip("\r\n") for line in sys.stdin]
    if not lines:
        raise ValueError("nothing to embed: pass a text, --text TEXT, or lines on stdin")
    return model, lines


def cmd_embed(args: argparse.Namespace) -> int:
    from ..errors import APIError
    from ..library.scan import scan
    from ..loader import NoPluginClaimed, load
    from ..model import LoadOptions
    from ..models.resolve import ModelNotFound
    from ..selection import chosen_model, report_selection_error, resolve

    try:
        args.positional, texts = texts_and_model(args)
        resolved = resolve(chosen_model(args), progress=False)
        model = load(str(resolved.path), LoadOptions(model_id=resolved.model_id, library=scan,
                                                     embedding=True), progress=False)
        result = model.hooks.embed(model=model, texts=texts, instruction=args.instruct)
        if result is None:
            raise APIError(f"{model.id} is not an embedding model")
    except ValueError as exc:
        print(f"mlxbun embed: {exc}", file=sys.stderr)
        return 2
    except ModelNotFound as exc:
        return report_selection_error(exc)
    except (NoPluginClaimed, APIError) as exc:
        print(f"mlxbun embed: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    vectors, used = result
    if args.json:
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]
        print(json.dumps({"object": "list", "data": data, "model": resolved.model_id,
                          "usage": {"prompt_tokens": used, "total_tokens": used}}))
    else:
        for v in vectors:
            print(json.dumps(v))
    return 0
