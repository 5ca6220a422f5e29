"""``mlxbun evals run``: a real ``mlxbun`` subprocess scores a tiny checkpoint on the
built-in tasks; every multiple-choice log-likelihood equals the sum taken straight from
mlx-lm's forward pass, every generated answer equals mlx-lm's greedy tokens, and the
scores are recorded where ``mlxbun evals`` lists them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import generate_step

from mlxbun_core.console import evalsets
from mlxbun_core.console.evaltasks import GEN_MAX_TOKENS
from mlxbun_core.testing.checkpoints import tiny_checkpoint


def mlx_lm_loglikelihoods(model, tok, question: str, choices: tuple[str, ...]) -> list[float]:
    """lm-eval's rule from mlx-lm directly: the choice's tokens (after the question's)
    summed under one forward pass of the whole text."""
    ctx = tok.encode(question)
    sums = []
    for choice in choices:
        whole = tok.encode(question + " " + choice)
        logits = model(mx.array(whole[:-1])[None])[0].astype(mx.float32)
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sums.append(sum(lp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole))))
    return sums


def mlx_lm_greedy_line(model, tok, prompt: str) -> str:
    """mlx-lm's greedy tokens for ``prompt`` (to EOS or the cap) through its streaming
    detokenizer (as mlx_lm.generate writes them), cut at the line's end."""
    detok = tok.detokenizer
    detok.reset()
    for token, _ in generate_step(mx.array(tok.encode(prompt)), model,
                                  max_tokens=GEN_MAX_TOKENS,
                                  sampler=lambda lp: mx.argmax(lp, axis=-1)):
        if int(token) in tok.eos_token_ids:
            break
        detok.add_token(int(token))
    detok.finalize()
    return detok.text.split("\n")[0]


def test_builtin_tasks_match_mlx_lm_and_are_recorded(tmp_path):
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}

    def mlxbun(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *args], env=env,
                              capture_output=True, text=True, timeout=600,
                              stdin=subprocess.DEVNULL)

    model_dir = tiny_checkpoint("qwen3", seed=72)
    run = mlxbun("evals", "run", str(model_dir), "--json")
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {r["task"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert list(rows) == ["mc", "gen", "json", "tools"]

    model, tok = load(str(model_dir))
    mc = rows["mc"]
    right = 0
    for (question, choices, answer), item in zip(evalsets.MC, mc["detail"]["items"],
                                                  strict=True):
        want = mlx_lm_loglikelihoods(model, tok, question, choices)
        assert all(abs(g - w) < 1e-3 for g, w in zip(item["loglikelihoods"], want,
                                                     strict=True)), (question, item, want)
        right += max(range(len(want)), key=want.__getitem__) == answer
    assert mc["metric"] == "acc" and mc["n"] == len(evalsets.MC)
    assert abs(mc["score"] - right / len(evalsets.MC)) < 1e-9

    gen = rows["gen"]
    for (question, _), item in zip(evalsets.GEN, gen["detail"]["items"], strict=True):
        prompt = f"{evalsets.GEN_SHOTS}Q: {question}\nA:"
        assert item["output"] == mlx_lm_greedy_line(model, tok, prompt), question
    assert gen["score"] == sum(i["match"] for i in gen["detail"]["items"]) / len(evalsets.GEN)

    # under the grammar every reply is valid, checked by jsonschema rather than the grammar
    assert rows["json"]["score"] == 1.0 and rows["tools"]["score"] == 1.0
    for item in rows["json"]["detail"]["items"]:
        json.loads(item["output"])
    assert all(item["calls"] for item in rows["tools"]["detail"]["items"])

    raw = [json.loads(line) for line in mlxbun("evals", "--raw").stdout.splitlines()]
    assert sorted(r["task"] for r in raw) == sorted(rows)
    table = mlxbun("evals").stdout
    assert "exact_match" in table and "acc" in table and model_dir.name[-20:] in table

    bad = mlxbun("evals", "run", str(model_dir), "--tasks", "mc,nope")
    assert bad.returncode == 2 and "unknown task nope" in bad.stderr
