"""One rank's share of a model served with --distributed: ``mlxbun fit --ranks N`` and the
arithmetic behind it (what a distributed serve's admission bills on rank 0)."""

from __future__ import annotations

import json
import subprocess
import sys

from mlxbun_core.library.fit import kv_bytes_per_token
from mlxbun_core.library.ranks import rank_config, rank_weight_bytes, replicated_bytes
from mlxbun_core.testing.checkpoints import tiny_checkpoint

CONFIG = {"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 8, "num_hidden_layers": 32, "vocab_size": 128256,
          "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def test_tensor_parallel_splits_the_kv_heads():
    whole = kv_bytes_per_token(CONFIG)
    assert kv_bytes_per_token(rank_config(CONFIG, 2, "tensor")) * 2 == whole
    assert kv_bytes_per_token(rank_config(CONFIG, 4, "tensor")) * 4 == whole
    assert rank_config(CONFIG, 2)["head_dim"] == 128  # the head size stays put


def test_pipeline_splits_the_layers():
    whole = kv_bytes_per_token(CONFIG)
    assert kv_bytes_per_token(rank_config(CONFIG, 2, "pipeline")) * 2 == whole
    assert rank_config(CONFIG, 3, "pipeline")["num_hidden_layers"] == 11  # rounded up


def test_weights_split_except_embedding_and_head():
    replicated = replicated_bytes(CONFIG, {"BF16": 16 << 30})
    assert replicated == 2 * 128256 * 4096 * 2  # untied: embedding and head
    total = 16 << 30
    assert rank_weight_bytes(total, replicated, 2) == (total - replicated + 1) // 2 + replicated
    assert rank_weight_bytes(total, replicated, 1) == total


def test_fit_ranks_reports_one_ranks_share(tmp_path):
    ckpt = tiny_checkpoint("llama", dtype="float32")

    def fit(*extra: str) -> dict:
        out = subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "fit", str(ckpt),
                              "--ctx", "4096", "--json", *extra], capture_output=True,
                             text=True, timeout=120, check=True)
        return json.loads(out.stdout)

    whole, half = fit(), fit("--ranks", "2")
    assert half["ranks"] == {"count": 2, "mode": "tensor",
                             "weights_bytes_per_rank": half["report"]["weights_bytes"]}
    assert half["report"]["kv_bytes_per_token"] * 2 == whole["report"]["kv_bytes_per_token"]
    assert half["report"]["weights_bytes"] < whole["report"]["weights_bytes"]
