"""What a step allocates beside the block pool, estimated from its plan before it runs.

On the portable ("gathered") attention path every layer copies each row's blocks into
one dense ``(rows, kv_heads, keys, dim)`` K and V, padded to the pass's longest row
(``storage.gathered``), and the model's attention then builds scores of
``(rows, heads, queries, keys)``. Beside them a pass holds its activations (the MLP's
intermediate is the widest) and, for a step that samples, the logits over the
vocabulary. None of it lives in the pool, so a pool that grew into all the memory the
governor measured leaves a wide step nothing to run in: the out-of-memory seen at 32
clients on an H200.

:class:`StepCost` turns a model's config into bytes per unit; :func:`plan_bytes`
prices one step of a plan on a batch. Layers run one after another and their
temporaries are freed as the next begins, so the widest layer is what counts, not
their sum. Scores are billed in float32 (MLX's attention on the CPU materialises them;
fused kernels need less, so the estimate is an upper bound there). A prefill chunk
computes no logits (the executor evaluates only the KV it writes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...library.fit import _attention_bytes, _layer_kinds
from ...models.facts import activation_bytes, text_config
from . import attention

if TYPE_CHECKING:
    from .executor import Batch

FLOAT32 = 4
INDEX = 4  # bytes of a gather index (int32)
ACTIVATION_BUFFERS = 5  # the MLP's gate, up, activation (gelu keeps one more), product, residual
RESIDUAL_BUFFERS = 4  # hidden-wide: the queries, attention's output, the residual, its norm
SCORE_BUFFERS = 2  # the scores and their softmax are alive together (masked in between)


@dataclass(frozen=True)
class StepCost:
    """Bytes a pass allocates per unit: ``kv`` per row and key position (the widest
    layer's gathered K+V and their gather indices), ``heads`` query heads (float32
    scores per row, head, query and key), ``vocab`` logits per sampled query (float32),
    ``activation`` per query token."""

    kv: int
    heads: int
    vocab: int
    activation: int
    unpacked: tuple[int, int] = (0, 0)  # (rows, bytes): a wide pass unpacks a layer's weights

    @classmethod
    def of(cls, config: dict[str, Any], unpacked: tuple[int, int] = (0, 0)) -> StepCost:
        """The cost of a model with HF ``config`` (``unpacked``: see ``wide_quant.py``)."""
        t = text_config(config)
        e = activation_bytes(config)
        kinds = {k for k in _layer_kinds(t) if k in ("full", "sliding")} or {"full"}
        heads = int(t.get("num_attention_heads") or 1)
        kv_heads = 1 if t.get("kv_lora_rank") else int(t.get("num_key_value_heads") or heads)
        kv = max(int(_attention_bytes(t, k, e)) for k in kinds) + 2 * kv_heads * INDEX
        vocab = int(t.get("vocab_size") or config.get("vocab_size") or 0)
        moe = int(t.get("moe_intermediate_size") or 0) * int(t.get("num_experts_per_tok") or 1)
        mlp = max(int(t.get("intermediate_size") or 0), moe)
        hidden = int(t.get("hidden_size") or 0)
        wide = max(hidden, heads * int(t.get("head_dim") or hidden // heads))
        return cls(kv, heads, vocab, (mlp * ACTIVATION_BUFFERS + wide * RESIDUAL_BUFFERS) * e,
                   unpacked)

    def bytes(self, rows: int, queries: int, keys: int, sampled: bool,
              gathered: bool = True) -> int:
        """One pass of ``rows`` rows, each ``queries`` positions wide over ``keys`` key
        positions (padded to the longest row's blocks); ``sampled``: it computes logits;
        ``gathered``: attention gathers (False: the direct kernel reads the blocks)."""
        if rows <= 0 or queries <= 0:
            return 0
        tokens = rows * queries
        out = tokens * self.activation + tokens * keys  # (the boolean mask)
        if self.unpacked[0] and tokens >= self.unpacked[0]:
            out += self.unpacked[1]
        if gathered:
            out += rows * keys * self.kv + tokens * self.heads * keys * FLOAT32 * SCORE_BUFFERS
        if sampled:
            out += tokens * self.vocab * FLOAT32
        return out


def keys_of(starts: list[int], width: int, block_size: int) -> int:
    """Key positions a pass of ``width`` from ``starts`` gathers (``view.Window``)."""
    if not starts:
        return 0
    blocks = max(1, max(-(-(s + width) // block_size) for s in starts))
    return blocks * block_size


def decode_bytes(cost: StepCost, batch: Batch, rows: list[int] | None = None,
                 width: int = 1) -> int:
    """A decode step of the decoding rows ``rows`` (default: all of them), ``width``
    positions each (1; a verify or forced window more)."""
    uids = batch.decoding if rows is None else rows
    starts = [batch.rows[u].table.length for u in uids]
    gathered = not (batch.direct and width <= attention.MAX_QUERY)
    return cost.bytes(len(starts), width,
                      keys_of(starts, width, batch.pool.block_size), True, gathered)


def prefill_bytes(cost: StepCost, batch: Batch, chunks: dict[int, int]) -> int:
    """A prefill chunk reading ``chunks[uid]`` prompt tokens of each row (one pass as
    wide as its widest chunk: the executor pads the others)."""
    if not chunks:
        return 0
    width = max(chunks.values())
    starts = [batch.rows[u].table.length for u in chunks]
    return cost.bytes(len(starts), width, keys_of(starts, width, batch.pool.block_size),
                      False)


def fit_chunks(cost: StepCost, batch: Batch, chunks: dict[int, int], room: int,
               floor: int) -> dict[int, int]:
    """``chunks`` cut until the pass fits in ``room`` bytes: each row's tokens halved
    down to ``floor``, then the youngest rows left out, down to the oldest row reading
    ``floor`` tokens (or less, halving on, when even that does not fit; never nothing)."""
    out = dict(chunks)
    while prefill_bytes(cost, batch, out) > room:
        widest = max(out.values())
        if widest > floor:
            cap = max(floor, widest // 2)
            out = {u: min(n, cap) for u, n in out.items()}
        elif len(out) > 1:
            del out[list(out)[-1]]
        elif widest > 1:
            out = {u: max(1, n // 2) for u, n in out.items()}
        else:
            break
    return out
