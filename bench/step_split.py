"""Where a batch's decode step spends the host's time: building the forward's graph
(``Batch.run_pass``), handing it to MLX (``mx.async_eval``: on CUDA the kernels are
encoded on this thread), and waiting for the previous step's tokens (``tolist``), per
step, medians. The step is pipelined: step N's graph is built and queued while the device
runs step N-1, so a wait near zero means the host is the bound, and a long wait the device.
One step's graph is counted too: its primitives by kind, each encoded on its own.

    python bench/step_split.py --model /tmp/bench-qwen3-8b-bfloat16 --rows 32
    python bench/step_split.py --layers 36 --hidden 64          # this CPU, a deep narrow llama
    python bench/step_split.py ... --heavy                      # mlx-lm's forward for decode
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # this tree
sys.path.insert(0, HERE)

import mlx.core as mx  # noqa: E402

from mlxbun_core.engine.batch import executor  # noqa: E402
from mlxbun_core.testing.graph import primitives  # noqa: E402


class Split:
    """Stopwatches around the step's three parts (the executor's module-level ``mx``
    and ``Batch.run_pass`` wrapped for the run)."""

    def __init__(self) -> None:
        self.laps: dict[str, list[float]] = {"build": [], "async_eval": [], "wait": []}
        self.nodes: dict[str, int] = {}

    def timed(self, name, fn):
        def run(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.laps[name].append(time.perf_counter() - t)
        return run

    def install(self):
        split, real = self, mx

        class Timed:
            def __getattr__(self, name):
                return getattr(real, name)

            @staticmethod
            def async_eval(*arrays):
                if len(split.laps["async_eval"]) == 5:  # one step's graph, counted
                    split.nodes = primitives(*arrays)
                return split.timed("async_eval", real.async_eval)(*arrays)

        executor.mx = Timed()  # type: ignore[assignment]  # (the bench's stopwatch)
        run_pass = executor.Batch.run_pass
        executor.Batch.run_pass = self.timed("build", run_pass)  # type: ignore[method-assign]
        return lambda: (setattr(executor, "mx", real),
                        setattr(executor.Batch, "run_pass", run_pass))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out")
    ap.add_argument("--reference", action="store_true",
                    help="direct attention in plain ops (a CPU has no kernel)")
    ap.add_argument("--heavy", action="store_true",
                    help="mlx-lm's own forward for decode steps too (no lean.py)")
    ap.add_argument("--fuse-mlp", action="store_true",
                    help="the lean step with each layer's gate and up in one matmul")
    args = ap.parse_args()
    from mlxbun_core.engine.batch import lean

    lean.ENABLED = not args.heavy
    lean.FUSE_MLP = args.fuse_mlp
    if args.reference:  # direct attention in plain ops: a CPU stand-in for the kernel's graph
        from mlxbun_core.engine.batch import attention

        attention.MODE = "reference"
    from mlx_lm import load

    from batch_step import decoding
    from host_overhead import checkpoint, prompts_for

    model, _ = load(args.model or checkpoint(args.layers, args.hidden))
    b = decoding(model, prompts_for(args.rows, args.prompt_tokens, 1000), args.tokens,
                 direct_on=True)
    split = Split()
    undo = split.install()
    steps = []
    try:
        while b.decoding:
            t = time.perf_counter()
            n_wait = len(split.laps["async_eval"])
            out = b.decode()
            steps.append(time.perf_counter() - t)
            if len(split.laps["async_eval"]) > n_wait:  # the rest of decode: mostly tolist
                split.laps["wait"].append(steps[-1] - split.laps["build"][-1]
                                          - split.laps["async_eval"][-1])
            for e in out:
                if e.finish:
                    b.remove(e.uid)
    finally:
        undo()
    med = {k: 1e3 * statistics.median(v[2:-2] or v) for k, v in split.laps.items()}
    med["step"] = 1e3 * statistics.median(steps[2:-2] or steps)
    res = {"args": vars(args), "device": str(mx.default_device()), "direct": b.direct,
           "lean": b.lean is not None,
           "ms": {k: round(v, 3) for k, v in med.items()},
           "primitives": sum(split.nodes.values()), "primitives_by_kind": split.nodes}
    print(json.dumps(res))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    b.close()


if __name__ == "__main__":
    main()
