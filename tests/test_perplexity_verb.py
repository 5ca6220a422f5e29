"""``mlxbun perplexity`` through a real subprocess on a tiny checkpoint: mean NLL, perplexity
and its standard error equal mlx-lm's own ``eval_ppl`` over the windows mlx-lm's method cuts
(seeded row order, EOS per row, non-overlapping windows)."""

import json
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.perplexity import eval_ppl
from mlx_lm.tuner.datasets import TextDataset

from mlxbun_core.testing.checkpoints import tiny_checkpoint

CLI = [sys.executable, "-m", "mlxbun_core.cli"]
ROWS = [f"row {i}: the quick brown fox jumps over the lazy dog {i * 7}" for i in range(12)]


def mlxbun(*args, stdin=""):
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "MLXBUN_LOG_LEVEL": "warning"})


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


def reference(ckpt, rows, length, samples, seed, batch):
    """mlx-lm's method, with its own dataset wrapper and scorer (its ``load_data`` reads
    only hub datasets, so the row order and windowing are its code's, inlined)."""
    model, tok = mlx_load(str(ckpt))
    ds = TextDataset([{"text": r} for r in rows], tok)
    np.random.seed(seed)
    mx.random.seed(seed)
    perm = np.random.permutation(len(ds)).tolist()
    data, i, want = [], 0, length * samples if samples > 0 else float("inf")
    while len(data) < want and i < len(perm):  # (mlx-lm's loop indexes past the end at -1)
        data.extend(ds.process(ds[perm[i]])[0])
        i += 1
    data = mx.array(data[: (len(data) // length) * length]).reshape(-1, length)
    data = data[:samples] if samples > 0 else data
    return eval_ppl(model, data, batch_size=batch), data.shape[0] * (length - 1)


def test_jsonl_equals_mlx_lm(ckpt, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": r}) + "\n" for r in ROWS))
    r = mlxbun("perplexity", str(ckpt), "--data-path", str(corpus), "--sequence-length", "32",
               "--num-samples", "5", "--batch-size", "2", "--seed", "7", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (ppl, se), tokens = reference(ckpt, ROWS, 32, 5, 7, 2)
    assert out["tokens"] == tokens and out["windows"] == 5
    assert out["perplexity"] == pytest.approx(ppl, rel=1e-6)
    assert out["perplexity_se"] == pytest.approx(se, rel=1e-5)
    assert out["mean_nll"] == pytest.approx(np.log(ppl), rel=1e-6)


def test_stdin_text_and_the_text_report(ckpt):
    text = " ".join(ROWS)
    r = mlxbun("perplexity", "--model", str(ckpt), "-", "--ctx", "16", "--num-samples", "-1",
               stdin=text)
    assert r.returncode == 0, r.stderr
    (ppl, se), tokens = reference(ckpt, [text], 16, -1, 123, 8)
    assert f"perplexity {ppl:.3f} ± {se:.3f}" in r.stdout, r.stdout
    assert f"over {tokens} tokens" in r.stdout and "windows of 16" in r.stdout


def test_too_short_and_bad_rows_exit_2(ckpt, tmp_path):
    short = mlxbun("perplexity", str(ckpt), "-", "--sequence-length", "4096", stdin="hi")
    assert short.returncode == 2 and "less than one window" in short.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"content": "x"}\n')
    r = mlxbun("perplexity", str(ckpt), str(bad))
    assert r.returncode == 2 and 'must be an object with a "text" string' in r.stderr
