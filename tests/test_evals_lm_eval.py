"""``mlxbun evals run --lm-eval``: lm-evaluation-harness's tasks through a temporary
in-process server. Without lm-eval the verb says how to get it; with it (the ``lmeval``
mark: lm-eval is not a dependency of ours, so these run where it is installed, named by
``MLXBUN_LM_EVAL``), a local multiple-choice task scores exactly what mlx-lm's own forward
pass gives, and the rows land in the eval DB.

    MLXBUN_LM_EVAL=/path/to/lm_eval python -m pytest -m lmeval tests/test_evals_lm_eval.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load

from mlxbun_core.console import evalsets
from mlxbun_core.testing.checkpoints import tiny_checkpoint


def mlxbun(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlxbun_core.cli", *args], env=env,
                          capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)


def test_without_lm_eval_the_verb_says_how_to_install_it(tmp_path):
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path / "home"), "PATH": str(tmp_path)}
    env.pop("MLXBUN_LM_EVAL", None)
    model = str(tiny_checkpoint("qwen3", seed=73))
    run = mlxbun(env, "evals", "run", model, "--lm-eval", "hellaswag")
    assert run.returncode == 2
    assert "lm-eval is not installed" in run.stderr and "lm-eval[api]" in run.stderr
    named = mlxbun(env, "evals", "run", model, "--lm-eval", "hellaswag",
                   "--lm-eval-cmd", str(tmp_path / "nowhere" / "lm_eval"))
    assert named.returncode == 2 and "no lm_eval command at" in named.stderr
    assert "no evals yet" in mlxbun(env, "evals").stdout


def write_mc_task(root: Path) -> None:
    """The built-in mc set as an lm-eval task over a local JSON file (no hub)."""
    data = root / "mc.jsonl"
    data.write_text("".join(json.dumps({"question": q, "choices": list(c), "answer": a}) + "\n"
                            for q, c, a in evalsets.MC))
    (root / "mlxbun_local_mc.yaml").write_text(
        f"task: mlxbun_local_mc\ndataset_path: json\ntest_split: test\ndataset_kwargs:\n"
        f"  data_files:\n    test: {data}\noutput_type: multiple_choice\n"
        "doc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\n"
        "doc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")


def mlx_lm_accuracy(model_dir: Path) -> float:
    """lm-eval's multiple-choice rule from mlx-lm directly (local-completions sends no
    BOS): the choice whose tokens after the question's sum highest."""
    model, tok = load(str(model_dir))
    right = 0
    for question, choices, answer in evalsets.MC:
        ctx = tok.encode(question, add_special_tokens=False)
        sums = []
        for choice in choices:
            whole = tok.encode(question + " " + choice, add_special_tokens=False)
            logits = model(mx.array(whole[:-1])[None])[0].astype(mx.float32)
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            sums.append(sum(lp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole))))
        right += max(range(len(sums)), key=sums.__getitem__) == answer
    return right / len(evalsets.MC)


@pytest.mark.lmeval
def test_lm_eval_local_task_scores_what_mlx_lm_gives_and_is_recorded(tmp_path):
    lm_eval = os.environ.get("MLXBUN_LM_EVAL")
    assert lm_eval, "set MLXBUN_LM_EVAL to an lm_eval command (pip install 'lm-eval[api]')"
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1"}
    model_dir = tiny_checkpoint("qwen3", seed=74)
    write_mc_task(tmp_path)
    run = mlxbun(env, "evals", "run", str(model_dir), "--lm-eval", "mlxbun_local_mc",
                 "--include-path", str(tmp_path), "--batch-size", "2", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = [json.loads(line) for line in run.stdout.splitlines()]
    assert row["task"] == "lm-eval:mlxbun_local_mc" and row["metric"] == "acc"
    assert row["n"] == len(evalsets.MC)
    assert abs(row["score"] - mlx_lm_accuracy(model_dir)) < 1e-9
    assert "Requesting API" in run.stderr  # lm-eval's own output, passed on to stderr
    raw = [json.loads(line) for line in mlxbun(env, "evals", "--raw").stdout.splitlines()]
    assert [r["task"] for r in raw] == ["lm-eval:mlxbun_local_mc"]
