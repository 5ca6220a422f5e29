"""What a second chat turn pays on CUDA: copying the cached KV, then one forward pass at a
query length never run before vs at one run before (the first pass at a length costs more)."""
import copy
import os
import random
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from mlxbun_core.testing.checkpoints import write_checkpoint

ck = "/tmp/bench-qwen3-8b-bfloat16"
if not os.path.exists(ck + "/config.json"):
    write_checkpoint(ck, "qwen3", seed=11, dtype="bfloat16", config_overrides={
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128})
model, tok = load(ck)

rng = random.Random(0)
toks = [rng.randrange(100, 1000) for _ in range(5300)]
base = make_prompt_cache(model)
for i in range(0, 5300, 2048):
    model(mx.array(toks[i:i + 2048])[None], cache=base)
    mx.eval([c.state for c in base])

def trial(n, label):
    t0 = time.perf_counter()
    c = copy.deepcopy(base)
    mx.eval([x.state for x in c])
    t1 = time.perf_counter()
    out = model(mx.array([rng.randrange(100, 1000) for _ in range(n)])[None], cache=c)
    mx.argmax(out[:, -1, :], axis=-1).item()
    t2 = time.perf_counter()
    print(f"{label:10} n={n:4d} copy {1e3*(t1-t0):7.1f} ms  forward {1e3*(t2-t1):7.1f} ms",
          flush=True)

for n in (52, 52, 52, 53, 54, 61, 75, 52, 53, 200, 200, 1, 1, 8, 9):
    trial(n, "seq")
