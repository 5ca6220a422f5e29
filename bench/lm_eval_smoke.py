"""lm-evaluation-harness against our server: a local multiple-choice task and a local
generation task through ``--model local-completions``, ``tokenized_requests`` on and off,
``--batch_size 2``; the multiple-choice accuracy is checked against the same sums taken
straight from mlx-lm's forward pass (so a server that scored nothing, or scored the wrong
tokens, shows up as a mismatch, not as a plausible number).

lm-eval is not a dependency of ours: install it where you like (it needs no torch for
this model type) and point ``--lm-eval`` at its command::

    python -m venv /tmp/lmeval-venv && /tmp/lmeval-venv/bin/pip install "lm-eval[api]"
    python bench/lm_eval_smoke.py --lm-eval /tmp/lmeval-venv/bin/lm_eval

It serves a tiny random checkpoint (``--model DIR`` serves another) on a free loopback
port in this process and writes what lm-eval printed to bench/results/lm_eval_smoke.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import bench_home  # this folder
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

OUT = Path(__file__).parent / "results" / "lm_eval_smoke.txt"
MC = [  # question, choices, answer (a random model's answers are what they are)
    ("The capital of France is", ["Paris", "a teapot", "blue"], 0),
    ("Water freezes at", ["zero degrees", "the moon", "seven apples"], 0),
    ("Two plus two equals", ["four", "green", "yesterday"], 0),
    ("The sun rises in the", ["east", "fridge", "song"], 0),
    ("A cat says", ["meow", "carburetor", "ninety"], 0),
]
GEN = [("Say hi:", "hi"), ("Count: one two", "three"), ("Colour of grass:", "green")]


def write_tasks(root: Path) -> None:
    """Two lm-eval tasks over local JSON files (no hub)."""
    mc = root / "mc.jsonl"
    mc.write_text("".join(json.dumps({"question": q, "choices": c, "answer": a}) + "\n"
                          for q, c, a in MC))
    gen = root / "gen.jsonl"
    gen.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in GEN))
    common = "dataset_path: json\ntest_split: test\n"
    (root / "mlxbun_tiny_mc.yaml").write_text(
        f"task: mlxbun_tiny_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {mc}\n"
        "output_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\n"
        "metric_list:\n  - metric: acc\n")
    (root / "mlxbun_tiny_gen.yaml").write_text(
        f"task: mlxbun_tiny_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {gen}\n"
        "output_type: generate_until\ndoc_to_text: '{{question}}'\n"
        "doc_to_target: '{{answer}}'\ngeneration_kwargs:\n  until: ['\\n']\n"
        "  max_gen_toks: 8\n  do_sample: false\n  temperature: 0\n"
        "metric_list:\n  - metric: exact_match\n")


def expected_accuracy(model_dir: Path) -> float:
    """lm-eval's multiple-choice rule, computed from mlx-lm directly: for each question,
    the choice whose tokens (after " ", given the question's, no BOS) sum highest."""
    import mlx.core as mx
    from mlx_lm import load

    model, tok = load(str(model_dir))
    right = 0
    for question, choices, answer in MC:
        ctx = tok.encode(question, add_special_tokens=False)
        sums = []
        for choice in choices:
            whole = tok.encode(question + " " + choice, add_special_tokens=False)
            logits = model(mx.array(whole[:-1])[None])[0].astype(mx.float32)
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            sums.append(sum(lp[i - 1, whole[i]].item() for i in range(len(ctx), len(whole))))
        right += max(range(len(sums)), key=sums.__getitem__) == answer
    return right / len(MC)


def run_lm_eval(lm_eval: str, base: str, tasks: Path, tokenized: bool, out: Path) -> str:
    args = [lm_eval, "run", "--model", "local-completions", "--model_args",
            f"base_url={base}/v1/completions,model=tiny,tokenized_requests={tokenized},"
            "num_concurrent=1,max_retries=1",
            "--tasks", "mlxbun_tiny_mc", "mlxbun_tiny_gen", "--include_path", str(tasks),
            "--batch_size", "2", "--output_path", str(out)]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=1200)
    return f"$ {' '.join(args)}\n(exit {done.returncode})\n{done.stdout}{done.stderr[-3000:]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lm-eval", default="lm_eval", help="the lm_eval command")
    ap.add_argument("--model", help="a checkpoint directory (default: a tiny random one)")
    bench_home.add_flag(ap)
    opts = ap.parse_args()
    bench_home.use(opts.home)
    model_dir = Path(opts.model) if opts.model else tiny_checkpoint("llama", seed=3)
    want = expected_accuracy(model_dir)
    srv = start_server(model_dir)
    report = [f"model: {model_dir.name}; expected mc acc from mlx-lm directly: {want:.4f}"]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            write_tasks(Path(tmp))
            for tokenized in (True, False):
                out = Path(tmp) / f"out-{tokenized}"
                report.append(run_lm_eval(opts.lm_eval, srv.base_url, Path(tmp), tokenized, out))
                found = [json.loads(p.read_text()) for p in out.rglob("results_*.json")]
                for res in found:
                    acc = res["results"]["mlxbun_tiny_mc"]["acc,none"]
                    report.append(f"tokenized_requests={tokenized}: mc acc {acc:.4f} "
                                  f"({'matches' if abs(acc - want) < 1e-9 else 'DIFFERS FROM'} "
                                  f"mlx-lm's {want:.4f})")
    finally:
        srv.stop()
    text = "\n\n".join(report) + "\n"
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
