"""``mlxbun perplexity``: a model's perplexity over a local text, by ``mlx_lm.perplexity``'s
method (seeded row order, rows tokenized with EOS and concatenated, cut into
non-overlapping windows, float32 cross-entropy at every position, the delta-method standard
error). Data is a local ``.jsonl`` of ``{"text": ...}`` rows, any other file as one text,
or ``-`` for stdin; never a hub dataset."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, cast

from ..serve_flags import add_selection_flags
from .oneshot import verb_parser


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verb_parser(sub, "perplexity", help="perplexity of a local model over a local text")
    p.add_argument("words", nargs="*", metavar="[model] [file]",
                   help="the model (unless --model/--query names it), then the data file")
    add_selection_flags(p)
    p.add_argument("--data-path", default=None, metavar="FILE",
                   help=".jsonl ({\"text\": ...} rows), another file as one text, - for stdin")
    p.add_argument("--sequence-length", "--ctx", dest="sequence_length", type=int, default=512,
                   help="tokens per window (default: %(default)s)")
    p.add_argument("--num-samples", type=int, default=256,
                   help="windows to score, -1 for all (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward "
                   "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=123, help="row order (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(handler=cmd_perplexity)


def read_rows(path: str) -> list[str]:
    """The texts: ``.jsonl`` rows' ``text`` fields, else the whole file (``-``: stdin)."""
    if path == "-":
        return [sys.stdin.read()]
    file = Path(path)
    if file.suffix != ".jsonl":
        return [file.read_text()]
    rows = []
    for n, line in enumerate(file.read_text().splitlines(), 1):
        if line.strip():
            row = json.loads(line)
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{n}: each row must be an object with a \"text\" string")
            rows.append(row["text"])
    return rows


def windows(tokenizer: Any, rows: list[str], length: int, samples: int, seed: int) -> Any:
    """mlx-lm's ``load_data``: rows in a seeded order, each with EOS, concatenated until
    ``samples`` windows are filled (or the rows run out), cut to whole windows."""
    import mlx.core as mx
    import numpy as np

    np.random.seed(seed)
    mx.random.seed(seed)
    order = np.random.permutation(len(rows)).tolist()
    wanted = length * samples if samples > 0 else math.inf
    eos = tokenizer.eos_token_id
    data: list[int] = []
    for i in order:
        if len(data) >= wanted:
            break
        ids = tokenizer.encode(rows[i])
        data.extend(ids if ids and ids[-1] == eos else [*ids, eos])
    whole = (len(data) // length) * length
    if whole == 0:
        raise ValueError(f"the text is {len(data)} tokens, less than one window of {length} "
                         "(lower --sequence-length)")
    out = mx.array(data[:whole]).reshape(-1, length)
    return out[:samples] if samples > 0 else out


def score(model: Any, data: Any, batch_size: int) -> dict[str, float]:
    """Mean NLL, perplexity and its standard error over every next-token position."""
    import mlx.core as mx
    import mlx.nn as nn

    losses = []
    for s in range(0, len(data), batch_size):
        batch = data[s:s + batch_size]
        logits = model(batch[:, :-1]).astype(mx.float32)
        loss = nn.losses.cross_entropy(logits, batch[:, 1:], reduction="none")
        mx.eval(loss)
        losses.append(loss.flatten())
    every = mx.concatenate(losses)
    nll = cast(float, every.mean().item())  # a float32 scalar
    ppl = math.exp(nll)
    se = cast(float, mx.sqrt(mx.var(every, ddof=1)).item()) / math.sqrt(every.size)
    return {"mean_nll": nll, "perplexity": ppl, "perplexity_se": ppl * se,
            "tokens": int(every.size)}


def cmd_perplexity(args: argparse.Namespace) -> int:
    from ..library.scan import scan
    from ..loader import NoPluginClaimed, load
    from ..model import LoadOptions
    from ..models.resolve import ModelNotFound
    from ..selection import chosen_model, report_selection_error, resolve

    words, named = list(args.words), bool(args.model or args.query)
    data_path = args.data_path or (words.pop() if len(words) > (0 if named else 1) else None)
    args.positional = words[0] if words else None
    if data_path is None or len(words) > (0 if named else 1):
        print("mlxbun perplexity: give one data file (--data-path FILE, or - for stdin)",
              file=sys.stderr)
        return 2
    try:
        rows = read_rows(data_path)
        resolved = resolve(chosen_model(args), progress=False)
        model = load(str(resolved.path), LoadOptions(model_id=resolved.model_id, library=scan),
                     progress=False)
        if model.kind != "generate":
            raise ValueError(f"{model.id} is a {model.kind} model, not a language model")
        data = windows(model.tokenizer, rows, args.sequence_length, args.num_samples, args.seed)
        t0 = time.monotonic()
        result = score(model.model, data, max(1, args.batch_size))
    except (OSError, ValueError, NoPluginClaimed) as exc:
        print(f"mlxbun perplexity: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except ModelNotFound as exc:
        return report_selection_error(exc)
    took = time.monotonic() - t0
    report = {"model": resolved.model_id, **result, "windows": int(data.shape[0]),
              "sequence_length": args.sequence_length, "seconds": round(took, 3)}
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{resolved.model_id}: perplexity {result['perplexity']:.3f} ± "
          f"{result['perplexity_se']:.3f} (mean NLL {result['mean_nll']:.4f}) over "
          f"{result['tokens']} tokens in {report['windows']} windows of "
          f"{args.sequence_length}; {result['tokens'] / max(took, 1e-9):.0f} tok/s")
    return 0
