"""What MTP rows cost in the engine's own batch, per decode step: 8 rows decoding plainly,
8 MTP rows (depth 2), and 4 of each, on the executor directly (``engine/batch`` with
``speculate/mtp_batch.py`` as its tap; no server, no lane). Rounds alternate the three
arms' order; medians of ms per step, tokens per step and the drafts' acceptance. MTP rows
draft while their drafts land (``speculate/gate.py``); ``--ungated`` adds the MTP arms
with that gate off (rows draft every step, as before it), in the same rotation.

A random-weight Qwen3.5 body (gated DeltaNet beside attention, float32) with the testing
builder's MTP head (``copy``: proposes the token it was given again; ``random``), so the
numbers are what the step costs, not what a real head gains (its acceptance decides that).

    python bench/mtp_step.py                      # --shape small: 512 hidden, 8 layers
    python bench/mtp_step.py --shape tiny --refeed 4
    python bench/mtp_step.py --ungated              # the landing gate on and off
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx

from mlxbun_core import loader, runconfig
from mlxbun_core.engine.batch import Batch, BlockPool
from mlxbun_core.engine.batch.layout import layout
from mlxbun_core.engine.speculate.mtp_batch import MtpBatch
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint

ROWS, STEPS = 8, 32
SHAPES = {
    "tiny": {},
    "small": {"text_config": {
        "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8,
        "layer_types": ["linear_attention", "full_attention"] * 4, "head_dim": 64,
        "num_attention_heads": 8, "num_key_value_heads": 2, "linear_num_key_heads": 4,
        "linear_num_value_heads": 8, "linear_key_head_dim": 64, "linear_value_head_dim": 64}},
}
ARMS = {"plain": set(), "mtp": set(range(ROWS)), "mixed": set(range(0, ROWS, 2))}
UNGATED = {"mtp-ungated": ARMS["mtp"], "mixed-ungated": ARMS["mixed"]}


def step_cost(model, predictor, tapped: set[int]) -> tuple[float, float, float | None]:
    """ms per step, tokens per step, acceptance of ``ROWS`` rows (``tapped``: MTP rows)."""
    mtp = MtpBatch(predictor)
    assert mtp.supported()
    batch = Batch(model, layout(model), BlockPool(16, 64, 1 << 20), tap=mtp)
    usage = [SimpleNamespace(speculation=None) for _ in range(ROWS)]
    for i in range(ROWS):
        batch.add(i, [5 + (i * 7 + j * 3) % 200 for j in range(32)], budget=1 << 20,
                  tapped=i in tapped)
        if i in tapped:
            mtp.add(i, 2, None, usage[i])
    while batch.prefilling:
        batch.prefill({u: 64 for u in batch.prefilling})
    for _ in range(4):  # warm: the first windows and the heads' first rows
        batch.decode(drafts=mtp.drafts(batch))
    mx.eval(batch.next_tokens)
    tokens, t0 = 0, time.perf_counter()
    for _ in range(STEPS):
        for e in batch.decode(drafts=mtp.drafts(batch)):
            tokens += 1
            if e.drafted:
                mtp.count(e.uid, e.drafted, e.accepted)
    mx.eval(batch.next_tokens)
    dt = time.perf_counter() - t0
    batch.close()
    spec = [u.speculation for u in usage if u.speculation]
    drafted = sum(s["drafted"] for s in spec)
    return dt / STEPS * 1000, tokens / STEPS, (sum(s["accepted"] for s in spec) / drafted
                                                if drafted else None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default="small")
    p.add_argument("--head", choices=["copy", "random"], default="copy")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--refeed", help="the refeed cap for this run (as MLXBUN_SPEC_BATCH_REFEED)")
    p.add_argument("--ungated", action="store_true",
                   help="also the MTP arms with the landing gate off (MLXBUN_SPEC_BATCH_GATE=0)")
    args = p.parse_args()
    if args.refeed:
        runconfig.install(runconfig.current().changed(
            speculation={"batch_refeed": max(1, int(args.refeed))}))
    path = tiny_checkpoint("qwen3_5", mtp=args.head, dtype="float32",
                           config_overrides=SHAPES[args.shape])
    loaded = loader.load(str(path), LoadOptions())
    predictor = loaded.hooks.token_predictor(model=loaded)
    arms = {**ARMS, **(UNGATED if args.ungated else {})}
    got: dict[str, list[tuple[float, float, float | None]]] = {a: [] for a in arms}
    names, base_config = list(arms), runconfig.current()
    for r in range(args.rounds):
        for arm in names[r % len(names):] + names[:r % len(names)]:
            runconfig.install(base_config.changed(
                speculation={"batch_gate": not arm.endswith("-ungated")}))
            got[arm].append(step_cost(loaded.model, predictor, arms[arm]))
    base = statistics.median(ms for ms, _, _ in got["plain"])
    for arm, runs in got.items():
        ms = statistics.median(m for m, _, _ in runs)
        acc = [a for _, _, a in runs if a is not None]
        print(f"{args.shape} {arm:13s} {ms:8.2f} ms/step ({ms / base:.2f}x plain)  "
              f"tokens/step {statistics.median(t for _, t, _ in runs):.2f}  acceptance "
              f"{statistics.median(acc) if acc else '-'}  all {[round(m, 1) for m, _, _ in runs]}")


if __name__ == "__main__":
    main()
