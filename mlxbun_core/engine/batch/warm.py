"""The batch's passes run once at start-up on scratch rows, so the first real batch pays
for no first use: the prefill chunk and the decode step at two rows (a padded pass), the
paged attention over blocks (directly where the batch runs it), with quantized weights
the quantized matmuls at M > 1, which the prefill buckets' single-row warm-up never
reaches, and the last row's way out of the batch (its partner removed, then exported and
decoded alone). The rows' blocks go back to the pool; nothing is published."""

from __future__ import annotations

import mlx.core as mx

from .executor import Batch

PROMPTS = ([0] * 6, [0] * 3)
"""Two scratch prompts of different lengths: their prefill pass pads one row."""
SCRATCH = (-1, -2)
"""Their row ids (a lane's own rows count up from 0)."""


def warm(batch: Batch, steps: int = 2) -> tuple[int, int]:
    """Prefill two scratch rows together, decode ``steps`` steps, drop them: the passes
    run and the most blocks the rows held. ``batch`` must hold no rows (start-up) and is
    left holding none."""
    if batch.rows:
        raise ValueError("the batch warm-up runs before any row is added")
    passes = held = 0
    try:
        for uid, prompt in zip(SCRATCH, PROMPTS):
            batch.add(uid, list(prompt), budget=steps + 1)
        while batch.prefilling:
            batch.prefill({u: len(batch.rows[u].todo) - 1 for u in batch.prefilling})
            passes += 1
        for _ in range(steps):
            batch.decode()
            passes += 1
            held = max(held, batch.pool.used)
        mx.eval(*[t for t in (batch.next_tokens,) if t is not None])
        batch.remove(SCRATCH[1])  # the partner ends first, as a real pair's shorter reply
        lone(batch, SCRATCH[0], steps)
    finally:
        for uid in SCRATCH:
            if uid in batch.rows:
                batch.remove(uid)
    return passes, held


def lone(batch: Batch, uid: int, steps: int) -> None:
    """The way the last row of a batch goes on alone (``lanes/results.py``: its partner
    removed, which gathers the rows' sampled tokens, then the row exported to a
    single-sequence cache and decoded by the model's own call from its pending token),
    run ``steps`` times. On CUDA the first use of that way compiled a kernel the batch's
    passes never need (the gather of the sampled tokens, ``bench/first_use_kernels.py``),
    and the first real request to go on alone paid 3-5 s for it (an 8B body on an H100:
    8 tokens at 1.5 tok/s after its partner ended)."""
    pending = batch.pending(uid)
    cache, _ = batch.export(uid)
    token = pending[0].reshape(1, 1) if pending is not None else mx.array([[0]], mx.uint32)
    for _ in range(steps):
        logits = batch.model(token, cache=cache)
        token = mx.argmax(logits[:, -1:], axis=-1).astype(mx.uint32)
        mx.eval(token)
