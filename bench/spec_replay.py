"""Replay recorded replies through prompt-lookup speculation's real policy, offline.

Whether a lookup draft lands depends only on the target's own samples, so a recorded
reply (greedy, or sampled at T=1) says exactly which windows a policy would send and
what they would accept. This drives the real :class:`SpecStream` with a stand-in model
that "samples" the recorded tokens, counts plain steps, windows (a draft window needs a
host sync, so it cannot be pipelined) and tokens, and prices them with a cost model:

    time = plain_steps * step + windows * (step + sync) + drafted * position

``step``: a pipelined decode step; ``sync``: what an unpipelined window adds (the host
round trip plus the graph building it no longer overlaps); ``position``: each extra
position in a window. Defaults fit a small model on a GPU (SmolLM2-135M on the H200:
step 5 ms, sync 3 ms, position 0.05 ms); ``--cost 8b`` prices an 8B body (step 6.6 ms,
sync 2 ms, position 0.1 ms).

    python bench/spec_replay.py --record              # SmolLM2 replies to bench/results/
    python bench/spec_replay.py                       # replay them, print the ratios
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from mlxbun_core.testing.helpers import OffsetCache  # (after the path above)

RECORDED = Path(__file__).resolve().parent / "results" / "spec_replay_smollm2.json"
COSTS = {"small": (5.0, 3.0, 0.05), "8b": (6.6, 2.0, 0.1)}


class _Recorded:
    """A model whose sample after absolute position ``p`` is ``seq[p + 1]``."""

    def __init__(self, seq: list[int], vocab: int):
        self.seq, self.vocab = seq, vocab
        self.calls = 0

    def __call__(self, inputs: Any, cache: list[OffsetCache]) -> Any:
        import mlx.core as mx

        width = inputs.shape[1]
        start = cache[0].offset
        cache[0].offset += width
        self.calls += 1
        nxt = [self.seq[min(start + i + 1, len(self.seq) - 1)] for i in range(width)]
        logits = mx.zeros((width, self.vocab))
        logits[mx.arange(width), mx.array(nxt)] = 30.0
        return logits[None]


def replay(prompt: list[int], reply: list[int], n_draft: int) -> dict[str, int]:
    """Windows, plain steps, drafts and accepted tokens the real policy spends on
    ``reply``."""
    import mlx.core as mx

    from mlxbun_core.engine.speculate.config import SpecConfig
    from mlxbun_core.engine.speculate.stream import SpecStream

    seq = prompt + reply
    vocab = max(seq) + 1
    model = _Recorded(seq, vocab)
    cache = [OffsetCache(len(prompt) - 1)]
    usage = {"drafted": 0, "accepted": 0, "targetCalls": 0}
    stream = SpecStream(model, cache, list(prompt[:-1]), SpecConfig(num_draft_tokens=n_draft),
                        lambda lp: mx.argmax(lp, axis=-1), [], usage)
    stream.begin(prompt[-1])
    out: list[int] = []
    windows = 0
    while len(out) < len(reply):
        if stream.inflight is not None and stream.inflight.drafts:
            windows += 1
        out += [t for t, _ in stream.step()]
    assert out[:len(reply)] == reply, "the replay must reproduce the recorded reply"
    return {"tokens": len(reply), "calls": model.calls, "windows": windows,
            "drafted": usage["drafted"], "accepted": usage["accepted"]}


def price(r: dict[str, int], cost: tuple[float, float, float]) -> float:
    """Modelled speed-up over plain decoding (one pipelined step per token)."""
    step, sync, position = cost
    plain_steps = r["calls"] - r["windows"]
    spec = plain_steps * step + r["windows"] * (step + sync) + r["drafted"] * position
    return r["tokens"] * step / spec


def record(out: Path, max_tokens: int, samples: int) -> None:
    """SmolLM2's replies to the speculation bench's prompts (greedy code and JSON; prose
    sampled at T=1, ``samples`` times)."""
    from mlx_lm.generate import stream_generate
    from mlx_lm.sample_utils import make_sampler

    from mlxbun_core.engine.core import Engine
    from speculation import workloads

    engine = Engine.load(None, progress=False, batch=1, prompt_cache_bytes=0)
    lm = engine.model
    rows = []
    try:
        for name, messages in workloads().items():
            prompt = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            for i in range(samples if name == "prose" else 1):
                temp = 1.0 if name == "prose" else 0.0

                def one(prompt: list[int] = prompt, temp: float = temp) -> list[int]:
                    return [r.token for r in stream_generate(
                        lm.model, lm.tokenizer, prompt, max_tokens=max_tokens,
                        sampler=make_sampler(temp=temp))]

                reply = engine.worker.run_sync(one)
                rows.append({"workload": name, "temperature": temp, "prompt": prompt,
                             "reply": reply})
                print(f"recorded {name} #{i}: {len(reply)} tokens", flush=True)
    finally:
        engine.close()
    out.write_text(json.dumps(rows))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--record", action="store_true", help="record SmolLM2 replies first")
    p.add_argument("--file", type=Path, default=RECORDED)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--samples", type=int, default=6, help="prose samples to record")
    p.add_argument("--draft", type=int, default=10, help="num_draft_tokens")
    p.add_argument("--cost", choices=list(COSTS), default="small")
    args = p.parse_args()
    if args.record:
        record(args.file, args.max_tokens, args.samples)
    rows = json.loads(args.file.read_text())
    by: dict[str, list[float]] = {}
    for row in rows:
        r = replay(row["prompt"], row["reply"], args.draft)
        x = price(r, COSTS[args.cost])
        by.setdefault(row["workload"], []).append(x)
        acc = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
        print(f"{row['workload']:6s} tokens {r['tokens']:4d} calls {r['calls']:4d} "
              f"windows {r['windows']:3d} drafted {r['drafted']:4d} accepted "
              f"{r['accepted']:4d} ({acc:.2f})  modelled {x:.2f}x")
    for name, xs in by.items():
        print(f"{name:6s} modelled speed-up, median {statistics.median(xs):.2f}x "
              f"(min {min(xs):.2f}, {len(xs)} replies)")


if __name__ == "__main__":
    main()
