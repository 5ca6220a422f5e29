"""Whether a model may run direct attention over blocks (``attention.py``).

Direct mode relies on the model handing the keys and values its cache returned to
``mx.fast.scaled_dot_product_attention`` untouched. Most mlx-lm models do; a model that
reshapes, repeats or slices them would read the pool wrong. So before a batch turns it
on, :func:`probe` runs one decode pass of two short synthetic rows both ways, gathered
and direct, and compares the logits: a difference beyond rounding (or an error) keeps
the model on the gathered path, with a log line saying so.

Rounding is judged relative to the logits' spread, not their largest value: a bf16 8B
model's 36 layers, summed in two orders, differ by ~0.07 on logits of a few units (an
H100, random weights), which an absolute bound mistook for a wrong read; a model that
reads the pool wrong attends the wrong positions and moves every logit by about its
spread.
"""

from __future__ import annotations

import logging
from typing import cast

import mlx.core as mx

from . import attention
from .executor import Batch, Forward
from .pool import BlockPool
from .states import copy_state
from .storage import LayerStore
from .view import PagedLayer

log = logging.getLogger("mlxbun.engine")

PROBE_ROWS = (11, 4)  # prompt lengths of the two synthetic rows
TOLERANCE = 0.1  # of the logits' spread (root mean square about their mean), per row


def probe(batch: Batch) -> bool:
    """Run the probe on a scratch batch over ``batch``'s model and layers; set
    ``batch.direct`` to its verdict and return it."""
    batch.direct = False
    if not attention.wanted() or not any(s is not None for s in batch.layout.stores):
        return False
    if batch.layout.journal is not None:  # a distributed batch: the scratch pool is ours alone
        return False
    attention.install()
    try:
        error = decode_both_ways(batch, [(False, batch.forward), (True, batch.forward)])
    except Exception as exc:  # a model the direct path cannot drive: stay gathered
        log.info("direct paged attention off for this model (%s)", exc)
        return False
    if error is None:  # a CacheList layer: such models keep the gathered path
        return False
    if error > TOLERANCE:
        log.info("direct paged attention off for this model: logits differ by %.3g of "
                 "their spread", error)
        return False
    log.info("paged attention: direct (%s)", "kernel" if attention.cuda_ready()
             else attention.MODE)
    batch.direct = True
    return True


def decode_both_ways(batch: Batch, runs: list[tuple[bool, Forward]]) -> float | None:
    """One decode pass of two synthetic rows, on a scratch batch over ``batch``'s model
    and layers, run each of two ways ``(direct, forward)`` from the same state: how far
    the second's logits are from the first's (:func:`relative_error`), or None where a
    layer keeps a list of caches (which neither way takes)."""
    scratch = Batch(batch.model, batch.layout.slots, BlockPool(batch.pool.block_size, 16))
    try:
        for uid, n in enumerate(PROBE_ROWS):
            scratch.add(uid, [1 + (7 * i) % 97 for i in range(n)], budget=2)
        while scratch.prefilling:
            scratch.prefill({u: 16 for u in scratch.prefilling})
        rows = [scratch.rows[u] for u in scratch.decoding]
        assert scratch.next_tokens is not None
        inputs = scratch.next_tokens[:, None]
        scratch.reserve(rows, [1] * len(rows))
        out = []
        for direct, forward in runs:
            view = scratch.window([r.table for r in rows], [1] * len(rows), 1)
            view.direct = direct
            states = [copy_state(c) for c in scratch.states.caches]  # both start alike
            rec = iter(states)
            caches = [next(rec) if store is None else  # (no KV scheme here: plain stores)
                      PagedLayer(cast(LayerStore, store), view, slot.window)
                      for slot, store in zip(scratch.layout.slots, scratch.layout.stores)
                      if not isinstance(store, list)]
            if len(caches) != len(scratch.layout.slots):
                return None
            logits = forward(inputs, caches)
            mx.eval(logits)
            out.append(logits.astype(mx.float32))
        return relative_error(out[0], out[1])
    finally:
        scratch.close()


def relative_error(want: mx.array, got: mx.array) -> float:
    """The worst row's distance between two passes' last logits, over the spread of the
    first pass's (root mean square about the row's mean)."""
    want, got = want.reshape(want.shape[0], -1), got.reshape(got.shape[0], -1)
    centred = want - mx.mean(want, axis=-1, keepdims=True)
    spread = mx.sqrt(mx.mean(centred * centred, axis=-1))
    off = mx.sqrt(mx.mean((got - want) ** 2, axis=-1))
    return float(cast(float, mx.max(off / mx.maximum(spread, 1e-6)).item()))
