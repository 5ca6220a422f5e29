"""The MTP loop (``engine/speculate/mtp.py``) on a cache that trims: a llama target (full
attention only) with a stand-in head that proposes the token it was given again. Greedy
output equals mlx-lm's plain decode whatever the depth, drafts land on the model's repeats
and are cut back out of the cache when rejected. (Recurrent-layer rollback and the served
paths: tests/test_mtp.py.)"""

from __future__ import annotations

import pytest
from mlx_lm import load as mlx_load
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from mlxbun_core.contract import TokenPredictor
from mlxbun_core.engine.speculate import MtpStream
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import mlx_lm_greedy
from mlxbun_core.testing.mtp import CopyPredictor as CopyHead


@pytest.fixture(scope="module")
def target():
    model, tok = mlx_load(str(tiny_checkpoint("llama", seed=3, dtype="float32")))
    return model, tok.encode("Once upon a time")


@pytest.mark.parametrize("depth", [1, 3])
def test_greedy_equals_plain_decode_on_a_trimmable_cache(target, depth):
    model, prompt = target
    head = CopyHead(model)
    assert isinstance(head, TokenPredictor)
    cache = make_prompt_cache(model)
    usage = {"drafted": 0, "accepted": 0, "targetCalls": 0}
    stream = MtpStream(head, cache, [], depth, make_sampler(0.0), [], usage)
    stream.read(prompt[:-1], prompt[-1])
    assert stream.head_cache[0].offset == len(prompt) - 1  # a row per prompt position
    stream.begin(prompt[-1])
    out: list[int] = []
    while len(out) < 40:
        out += [t for t, _ in stream.step()]
    assert out[:40] == mlx_lm_greedy(model, prompt, 40, ())
    assert usage["accepted"] > 0 and usage["drafted"] > usage["accepted"]
    # the cache holds what was fed plus the window in flight; the head one row per
    # position whose next token is known (its chained rows were trimmed)
    in_flight = 1 + depth
    assert cache[0].offset == len(stream.fed) - 1 + in_flight
    assert stream.head_cache[0].offset == len(stream.fed) - 1
    stream.settle()
    assert cache[0].offset == len(stream.fed)
