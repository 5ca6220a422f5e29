"""Preference rows (``{prompt, chosen, rejected}``) as token pairs, and their batches.

``prompt`` is a string (one user turn) or a chat-messages array; ``chosen`` and ``rejected``
are strings (one assistant turn), one message or a list of messages. Both completions are
rendered through the model's chat template after the same prompt, as mlx-lm renders its
prompt/completion rows, so the response starts where the prompt's generation prompt ends.
The batches are mlx-lm's shape (``tokens [2B, T]``, ``lengths [2B, 2]``), chosen rows first.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
import numpy as np

from .events import JobError

Pair = tuple[list[int], list[int], int]  # chosen tokens, rejected tokens, prompt tokens
PAD_TO = 32


def _messages(value: Any, role: str, where: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": role, "content": value}]
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        return value
    raise JobError(f"{where}: {role} text must be a string or chat messages")


def encode_pair(tokenizer: Any, row: dict, where: str) -> Pair:
    """One row as (chosen, rejected, prompt length) token lists."""
    if not isinstance(row, dict) or not {"prompt", "chosen", "rejected"} <= row.keys():
        raise JobError(f"{where}: a preference row needs prompt, chosen and rejected")
    prompt = _messages(row["prompt"], "user", where)

    def render(messages: list[dict], **kw: Any) -> list[int]:
        return list(tokenizer.apply_chat_template(messages, return_dict=False, **kw))

    start = len(render(prompt, add_generation_prompt=True))
    chosen = render(prompt + _messages(row["chosen"], "assistant", where))
    rejected = render(prompt + _messages(row["rejected"], "assistant", where))
    return chosen, rejected, start


def load_pairs(path: Path, tokenizer: Any, max_seq_length: int) -> tuple[list[Pair], int]:
    """The file's pairs, and how many were left out because the prompt alone fills
    ``max_seq_length`` (no response token would be left to score)."""
    pairs: list[Pair] = []
    dropped = 0
    if not path.is_file():
        return pairs, 0
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise JobError(f"{path.name} line {n}: not JSON ({exc})") from None
            pair = encode_pair(tokenizer, row, f"{path.name} line {n}")
            if pair[2] >= max_seq_length:
                dropped += 1
            else:
                pairs.append(pair)
    return pairs, dropped


def pair_batch(pairs: list[Pair], max_seq_length: int) -> tuple[mx.array, mx.array]:
    """``(tokens [2B, T], lengths [2B, 2])``: chosen rows, then rejected, truncated to
    ``max_seq_length`` and padded (with 0) to a multiple of 32 plus one, as mlx-lm pads."""
    rows = [p[0] for p in pairs] + [p[1] for p in pairs]
    starts = [p[2] for p in pairs] * 2
    lengths = [min(len(r), max_seq_length) for r in rows]
    width = min(1 + PAD_TO * ((max(lengths) + PAD_TO - 1) // PAD_TO), max_seq_length)
    tokens = np.zeros((len(rows), width), np.int32)
    for i, (row, n) in enumerate(zip(rows, lengths)):
        tokens[i, :n] = row[:n]
    return mx.array(tokens), mx.array(list(zip(starts, lengths)))


def iterate_pairs(dataset: list[Pair], batch_size: int, max_seq_length: int,
                  loop: bool = False, seed: int | None = None,
                  comm_group: Any = None) -> Iterator[tuple[mx.array, mx.array]]:
    """mlx-lm's ``iterate_batches`` for pairs (its signature, so ``train`` and
    ``evaluate`` drive it): length-sorted batches in a shuffled order."""
    if len(dataset) < batch_size:
        raise JobError(f"the dataset has {len(dataset)} pairs, fewer than batch_size "
                       f"{batch_size}")
    order = sorted(range(len(dataset)), key=lambda i: len(dataset[i][0]) + len(dataset[i][1]))
    batches = [order[i:i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    rng = np.random.default_rng(seed)
    while True:
        for b in rng.permutation(len(batches)):
            yield pair_batch([dataset[i] for i in batches[b]], max_seq_length)
        if not loop:
            return


def mean_margin(model: Any, pairs: list[Pair], max_seq_length: int) -> float:
    """Mean of ``log π(chosen) - log π(rejected)`` (summed response log-probs) over
    ``pairs``: the number a preference run should raise on its training rows."""
    from .preference_loss import masked_sum, token_logprobs

    if not pairs:
        return 0.0
    total = 0.0
    for i in range(0, len(pairs), 4):
        chunk = pairs[i:i + 4]
        tokens, lengths = pair_batch(chunk, max_seq_length)
        logp, response, _ = token_logprobs(model, tokens, lengths)
        seq = masked_sum(logp, response)
        margin = (seq[:len(chunk)] - seq[len(chunk):]).sum().item()
        total += float(cast(float, margin))
    return total / len(pairs)
