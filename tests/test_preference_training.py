"""DPO and ORPO (issue #37): the losses against a hand computation, a few steps that move
the chosen-rejected margin the right way (through ``mlxbun train`` in a real subprocess,
checked with mlx-lm's own loader), warm start, gradient clipping, ``train-watch`` and
``fuse`` as real subprocesses on a tiny checkpoint."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import load

from mlxbun_core.jobs.preference_data import encode_pair, pair_batch
from mlxbun_core.jobs.preference_loss import dpo, orpo
from mlxbun_core.jobs.store import JobStore
from mlxbun_core.jobs.train_loop import clipped
from mlxbun_core.testing.checkpoints import tiny_checkpoint

ROWS = [{"prompt": f"Pick a fruit for day {i}", "chosen": "banana banana banana",
         "rejected": "cherry cherry cherry"} for i in range(8)]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def prefs(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefs")
    rows = ROWS[:6] + [{"prompt": [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "A fruit?"}],
                        "chosen": {"role": "assistant", "content": "banana"},
                        "rejected": "cherry"}]  # the chat-messages form
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[6:]))
    return d


def cli(*argv, home, timeout=300):
    env = {**os.environ, "MLXBUN_HOME": str(home), "MLX_DISABLE_COMPILE": "1"}
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def response_logps(model, tokens: list[int], start: int) -> np.ndarray:
    """log p of each response token, from one unpadded forward, by numpy."""
    logits = np.array(model(mx.array([tokens[:-1]])).astype(mx.float32))[0]
    logits = logits - logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    per_token = logp[np.arange(len(tokens) - 1), tokens[1:]]  # token j at row j-1
    return per_token, per_token[start - 1:]


def margin(model, tokenizer) -> float:
    pairs = [encode_pair(tokenizer, r, "row") for r in ROWS[:6]]
    return float(np.mean([response_logps(model, c, s)[1].sum() - response_logps(model, r, s)[1]
                          .sum() for c, r, s in pairs]))


def log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x))


def test_losses_equal_a_hand_computation(ckpt):
    base, tokenizer = load(str(ckpt))
    policy, _ = load(str(ckpt))
    policy.freeze()
    linear_to_lora_layers(policy, -1, {"rank": 4, "scale": 2.0, "dropout": 0.0})
    mx.random.seed(3)  # a non-zero delta: the policy differs from its reference
    policy.update(_random_b(policy))
    rows = [ROWS[0], {"prompt": "Name a colour", "chosen": "blue", "rejected": "a very long "
                      "answer about many colours"}]
    pairs = [encode_pair(tokenizer, r, "row") for r in rows]
    tokens, lengths = pair_batch(pairs, 512)

    beta, lam = 0.3, 0.7
    dpo_terms, orpo_full, orpo_response = [], [], []
    for chosen, rejected, start in pairs:
        c_all, c = response_logps(policy, chosen, start)
        _, r = response_logps(policy, rejected, start)
        _, ref_c = response_logps(base, chosen, start)
        _, ref_r = response_logps(base, rejected, start)
        assert abs(c.sum() - ref_c.sum()) > 1e-3  # the reference is not the policy
        dpo_terms.append(-log_sigmoid(beta * ((c.sum() - r.sum()) - (ref_c.sum() - ref_r.sum()))))
        mc, mr = c.mean(), r.mean()
        odds = (mc - mr) - (math.log(1 - math.exp(mc)) - math.log(1 - math.exp(mr)))
        orpo_full.append(-c_all.mean() - lam * log_sigmoid(odds))
        orpo_response.append(-mc - lam * log_sigmoid(odds))

    got, ntoks = dpo(beta)(policy, tokens, lengths)
    assert got.item() == pytest.approx(np.mean(dpo_terms), rel=2e-4, abs=1e-5)
    assert ntoks.item() == sum(len(c) + len(r) - 2 * s for c, r, s in pairs)
    got = orpo(lam, "full")(policy, tokens, lengths)[0].item()
    assert got == pytest.approx(np.mean(orpo_full), rel=2e-4)
    got = orpo(lam, "response")(policy, tokens, lengths)[0].item()
    assert got == pytest.approx(np.mean(orpo_response), rel=2e-4)
    # the reference pass put every LoRA scale back
    assert {m.scale for m in policy.modules() if "lora_a" in m} == {2.0}


def _random_b(model) -> list:
    from mlx.utils import tree_unflatten

    return tree_unflatten([(k, mx.random.normal(v.shape) * 0.05)
                           for k, v in tree_flatten(model.trainable_parameters())
                           if k.endswith("lora_b")])


@pytest.mark.parametrize("method", ["dpo", "orpo"])
def test_a_few_steps_raise_the_chosen_margin(ckpt, prefs, tmp_path, method):
    out = tmp_path / method
    run = cli("train", ckpt, "--data", prefs, "--method", method, "--iters", 8, "--lr", 1e-2,
              "--rank", 4, "--adapter", out, "--beta", 0.5, "--lambda", 0.5, home=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "8/8" in run.stderr
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["method"] == method and config["lora_parameters"]["rank"] == 4
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["kind"] == "train"] == list(range(1, 9))

    base, tokenizer = load(str(ckpt))
    tuned, _ = load(str(ckpt), adapter_path=str(out))  # mlx-lm's loader, not ours
    before, after = margin(base, tokenizer), margin(tuned, tokenizer)
    assert after > before + 1.0, (before, after)
    summary = JobStore(tmp_path / "jobs.sqlite").events(
        JobStore(tmp_path / "jobs.sqlite").list()[0]["id"])[-1][1]["summary"]
    assert summary["margin_after"] > summary["margin_before"]


def test_resume_warm_starts_from_an_adapter(ckpt, prefs, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert cli("train", ckpt, "--data", prefs, "--method", "dpo", "--iters", 6, "--lr", 1e-2,
               "--rank", 4, "--adapter", first, home=tmp_path).returncode == 0
    run = cli("train", ckpt, "--data", prefs, "--method", "dpo", "--iters", 1, "--lr", 1e-9,
              "--rank", 4, "--adapter", second, "--resume", first, home=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    base, tokenizer = load(str(ckpt))
    tuned, _ = load(str(ckpt), adapter_path=str(first))
    resumed, _ = load(str(ckpt), adapter_path=str(second))
    assert margin(resumed, tokenizer) == pytest.approx(margin(tuned, tokenizer), abs=1e-3)
    assert abs(margin(resumed, tokenizer) - margin(base, tokenizer)) > 1.0


def test_gradient_clipping_bounds_the_update():
    params = {"w": mx.zeros((4,))}
    grads = {"w": mx.array([30.0, 40.0, 0.0, 0.0])}  # norm 50
    sgd = clipped(optim.SGD, 5.0)(learning_rate=1.0)
    new = sgd.apply_gradients(grads, params)
    assert np.allclose(np.array(new["w"]), [-3.0, -4.0, 0.0, 0.0])
    plain = clipped(optim.SGD, 0.0)(learning_rate=1.0)  # 0: off
    assert np.allclose(np.array(plain.apply_gradients(grads, params)["w"]), [-30, -40, 0, 0])


def test_train_watch_follows_a_job_to_its_end(ckpt, prefs, tmp_path):
    out = tmp_path / "watched"
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path), "MLX_DISABLE_COMPILE": "1"}
    train = subprocess.Popen([sys.executable, "-m", "mlxbun_core.cli", "train", str(ckpt),
                              "--data", str(prefs), "--iters", "40", "--rank", "2",
                              "--adapter", str(out)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (tmp_path / "jobs.sqlite").is_file() or not JobStore(
                tmp_path / "jobs.sqlite").list():
            assert time.time() < deadline and train.poll() is None
            time.sleep(0.2)
        watch = cli("train-watch", out, home=tmp_path)
        assert train.wait(timeout=120) == 0
    finally:
        if train.poll() is None:
            train.kill()
    assert watch.returncode == 0, watch.stderr
    lines = watch.stdout.splitlines()
    assert lines[0].startswith("mlxbun: watching finetune-")
    assert any(x.startswith("step 40/40  loss ") and "tok/s" in x for x in lines), lines[-5:]
    assert lines[-1].startswith(f"done: {out}") and "margin_after=" in lines[-1]

    # a failed job: its error, status 1; nothing to watch: status 2
    assert cli("train", ckpt, "--data", prefs, "--method", "sft", "--iters", 2,
               home=tmp_path).returncode == 1
    failed = cli("train-watch", "--no-follow", home=tmp_path)
    assert failed.returncode == 1 and "failed: sft needs rows of messages" in failed.stdout
    missing = cli("train-watch", tmp_path / "nowhere", home=tmp_path)
    assert missing.returncode == 2 and "no fine-tune job" in missing.stderr


def test_fuse_writes_base_plus_adapter_as_one_model(ckpt, prefs, tmp_path):
    adapter, fused = tmp_path / "adapter", tmp_path / "fused"
    assert cli("train", ckpt, "--data", prefs, "--method", "orpo", "--iters", 4, "--lr", 1e-2,
               "--rank", 4, "--adapter", adapter, home=tmp_path).returncode == 0
    run = cli("fuse", "--model", ckpt, "--adapter-path", adapter, "--save-path", fused,
              home=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "fused" in run.stdout and (fused / "config.json").is_file()

    prompt = mx.array([[1, 5, 9, 14, 22]])
    with_adapter, _ = load(str(ckpt), adapter_path=str(adapter))
    merged, _ = load(str(fused))
    base, _ = load(str(ckpt))
    want = np.array(with_adapter(prompt).astype(mx.float32))

    def off(model) -> float:
        return float(np.abs(np.array(model(prompt).astype(mx.float32)) - want).mean())

    # the fused weights are rounded to the checkpoint's bfloat16: near, not bit-equal
    print(f"fused vs base+adapter {off(merged):.4f}, base vs base+adapter {off(base):.4f}")
    assert off(merged) < 0.1 * off(base)

    refused = cli("fuse", ckpt, "--adapter", adapter, "--save-path", tmp_path / "g",
                  "--export-gguf", home=tmp_path)
    assert refused.returncode == 2 and "GGUF export is not implemented" in refused.stderr
    again = cli("fuse", ckpt, "--adapter", adapter, "--save-path", fused, home=tmp_path)
    assert again.returncode == 2 and "not empty" in again.stderr
