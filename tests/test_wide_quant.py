"""Quantized layers that dequantize for wide passes (``engine/wide_quant.py``).

A quantized tiny llama (float32 scales, 4-bit) is decoded by the engine's batch with
its quantized layers swapped for wide ones that unpack from 2 rows: every row's greedy
tokens must equal mlx-lm's ``generate_step`` on the same quantized model with its layers
as mlx-lm made them, and a layer must answer the same either way below and above its
row count. The engine turns it on only where asked (``MLXBUN_UNPACK_QUANTIZED``) and
says so in ``/stats``-visible admission and the batch plan.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm import load

from mlxbun_core.engine import wide_quant
from mlxbun_core.engine.batch.executor import Batch
from mlxbun_core.engine.batch.layout import layout
from mlxbun_core.engine.batch.pool import BlockPool
from mlxbun_core.engine.batch.transient import StepCost
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import mlx_lm_greedy

N = 8


@pytest.fixture(scope="module")
def quantized_dir(tmp_path_factory):
    from mlx_lm import convert

    src = tiny_checkpoint("llama", seed=5, dtype="float32")
    out = tmp_path_factory.mktemp("q4") / "model"
    convert(str(src), str(out), quantize=True, q_bits=4, q_group_size=32)
    return str(out)


def test_a_wide_layer_answers_as_the_quantized_one():
    q = nn.QuantizedLinear.from_linear(nn.Linear(64, 96), group_size=32, bits=4)
    wide = wide_quant.WideQuantizedLinear(q, min_rows=4)
    assert isinstance(wide, nn.QuantizedLinear)  # adapters still see a quantized layer
    x = mx.random.normal((2, 6, 64))  # 12 rows: unpacked
    few = x[:1, :3]  # 3 rows: the quantized matmul
    assert mx.allclose(wide(x), q(x), atol=1e-4).item()
    assert mx.array_equal(wide(few), q(few)).item()


def test_install_swaps_only_plain_quantized_linears(quantized_dir):
    model = load(quantized_dir)[0]
    plain = sum(type(m) is nn.QuantizedLinear for _, m in model.named_modules())
    assert plain > 0
    assert wide_quant.install(model, 2) == plain
    assert not any(type(m) is nn.QuantizedLinear for _, m in model.named_modules())
    assert wide_quant.install(model, 2) == 0  # done already
    assert wide_quant.widest_bytes(model) > 0


def test_batch_rows_equal_mlx_lm_with_unpacked_layers(quantized_dir):
    reference_model = load(quantized_dir)[0]
    model = load(quantized_dir)[0]
    wide_quant.install(model, 2)
    prompts = [[5 + (i * 7 + j * 3) % 200 for j in range(n)] for i, n in enumerate([9, 3, 17])]
    want = {i: mlx_lm_greedy(reference_model, p, N, ()) for i, p in enumerate(prompts)}
    b = Batch(model, layout(model), BlockPool(4, 8, 4096))
    for i, p in enumerate(prompts):
        b.add(i, p, budget=N)
    got: dict[int, list[int]] = {i: [] for i in want}
    while b.rows:
        if b.prefilling:
            b.prefill({u: 5 for u in b.prefilling})  # 5-token chunks x rows: unpacked
        for e in b.decode():  # 3 rows, then fewer: both ways
            got[e.uid].append(e.token)
            if e.finish:
                b.remove(e.uid)
    b.close()
    assert got == want
    assert b.pool.used == 0


def test_a_wide_step_is_priced_with_the_unpacked_weights():
    config = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "intermediate_size": 128, "vocab_size": 256, "num_hidden_layers": 2}
    plain = StepCost.of(config)
    unpacked = StepCost.of(config, (8, 1 << 20))
    assert unpacked.bytes(4, 1, 64, True) == plain.bytes(4, 1, 64, True)  # 4 rows: packed
    assert unpacked.bytes(8, 1, 64, True) == plain.bytes(8, 1, 64, True) + (1 << 20)


def test_the_switch_decides_where(monkeypatch):
    assert wide_quant.min_rows("cuda") == wide_quant.CUDA_MIN_ROWS
    assert wide_quant.min_rows("metal") == 0
    assert wide_quant.min_rows("cpu") == 0
    assert wide_quant.min_rows("cpu", "on") == wide_quant.CUDA_MIN_ROWS
    assert wide_quant.min_rows("cuda", "off") == 0


def test_the_warm_up_runs_every_quantized_matmul_at_the_row_counts_a_batch_reaches(
        quantized_dir, monkeypatch):
    """MLX's CUDA build compiles its tiled quantized matmul (8 rows and more) at first use:
    the start-up runs each kind of quantized layer the model holds, wide ones and a tied
    output projection alike, at every row count in ``WARM_ROWS``."""
    model, _ = load(quantized_dir)
    wide_quant.install(model, 8)
    seen: dict[tuple[int, ...], set[int]] = {}
    real = mx.quantized_matmul

    def spy(x, w, *args, **kw):
        seen.setdefault(tuple(w.shape), set()).add(x.shape[0])
        return real(x, w, *args, **kw)
    monkeypatch.setattr(mx, "quantized_matmul", spy)
    ran = wide_quant.warm_matmuls(model)
    shapes = {tuple(m["weight"].shape) for _, m in model.named_modules()
              if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    assert set(seen) == shapes  # every kind, the embedding's output use among them
    assert all(rows == set(wide_quant.WARM_ROWS) for rows in seen.values())
    assert ran == len(shapes) * len(wide_quant.WARM_ROWS)


def test_the_warm_up_runs_every_quantized_expert_block_sorted_and_not(monkeypatch):
    """A mixture of experts whose experts are quantized: each kind of expert block runs at
    every row count in ``WARM_ROWS``, its gathered quantized matmuls both unsorted (few
    rows) and sorted (from 64 rows-times-experts), as a decode batch reaches them."""
    from mlx_lm.models.switch_layers import SwitchGLU, SwitchMLP

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.glu = SwitchGLU(64, 32, 4)
            self.twin = SwitchGLU(64, 32, 4)  # the same kind: run once
            self.mlp = SwitchMLP(64, 64, 6)
            self.dense = SwitchGLU(32, 32, 4)  # not quantized: left alone

    model = Moe()
    nn.quantize(model, group_size=32, bits=4,
                class_predicate=lambda path, m: not path.startswith("dense")
                and hasattr(m, "to_quantized"))
    seen: list[tuple[int, bool]] = []
    real = mx.gather_qmm

    def spy(x, w, *args, sorted_indices=False, **kw):
        seen.append((int(w.shape[0]), sorted_indices))
        return real(x, w, *args, sorted_indices=sorted_indices, **kw)
    monkeypatch.setattr(mx, "gather_qmm", spy)
    ran = wide_quant.warm_experts(model)
    assert ran == 2 * len(wide_quant.WARM_ROWS)  # glu (twin shares its kind) and mlp
    assert {experts for experts, _ in seen} == {4, 6}
    assert {done for _, done in seen} == {True, False}  # both of the block's ways
    assert wide_quant.warm_experts(nn.Module()) == 0
