"""How close `mlxbun fit`'s decode prediction comes to a measured decode, on this machine.

Each round, in one process: the bandwidth micro-benchmark `fit` uses (library/bandwidth.py,
measured fresh, not the remembered value), then a greedy decode of the embedded default
(SmolLM2-135M, float32) through mlx-lm; the prediction is bandwidth / (weight bytes + KV
bytes at that context), as `fit` computes it.

    .venv/bin/python bench/fit_calibration.py [--rounds 3] [--gen 48]
"""

from __future__ import annotations

import argparse
import json
import time

import mlxbun_core  # noqa: F401  (routes the BLAS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gen", type=int, default=48)
    args = ap.parse_args()

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    from mlxbun_core import blas
    from mlxbun_core.library.bandwidth import measure_gbs
    from mlxbun_core.library.fit import kv_layout, predicted_decode_tps
    from mlxbun_core.models.resolve import resolve_model

    path = resolve_model(None, progress=True).path
    model, tok = load(str(path))
    weights = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    config = json.loads((path / "config.json").read_text())
    prompt = tok.encode("Write a short story about a lighthouse keeper.")
    ban_eos = make_logits_processors({t: -1e9 for t in tok.eos_token_ids})
    rows = []
    for r in range(args.rounds):
        gbs = measure_gbs(gpu=mx.default_device() == mx.gpu)
        last = None
        for last in stream_generate(model, tok, prompt, max_tokens=args.gen,  # noqa: B007 (totals)
                                    logits_processors=ban_eos):
            pass
        ctx = len(prompt) + args.gen
        predicted = predicted_decode_tps(weights, kv_layout(config).bytes_at(ctx), gbs)
        rows.append({"round": r, "bandwidth_gbs": gbs, "predicted_tps": predicted,
                     "measured_tps": round(last.generation_tps, 2),
                     "ratio_measured_over_predicted": round(last.generation_tps / predicted, 2)})
        print(json.dumps(rows[-1]), flush=True)
        time.sleep(1)
    print(json.dumps({"blas": blas.state().name, "weights_bytes": weights, "rows": rows}))


if __name__ == "__main__":
    main()
