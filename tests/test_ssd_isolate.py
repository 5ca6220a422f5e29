"""`serve --isolate --model-pool 2 --ssd-cache DIR`: a third model evicts the least recently
used engine, whose drain demotes its prompt cache to the SSD tier (the drain's
``demotions`` is real), and switching back restores it in the new engine; the answer
matches a cold run."""

from __future__ import annotations

import time

import httpx

from mlxbun_core.engine.core import Engine
from mlxbun_core.testing.engine import close, token_ids
from mlxbun_core.testing.hub_cache import library_env, library_hub
from mlxbun_core.testing.process import serve
from mlxbun_core.testing.turns import engine_reply

LLAMA, QWEN, THIRD = "acme/Tiny-Llama-Chat", "other/Qwen3-Tiny", "other/Qwen3-Tiny-B"
MODELS = {LLAMA: ("llama", {"seed": 11}), QWEN: ("qwen3", {"seed": 13}),
          THIRD: ("qwen3", {"seed": 14})}
HISTORY = [{"role": "system", "content": "You are terse. " * 8},
           {"role": "user", "content": "Tell me about the sea and the sky. " * 14}]


def body(model, messages):
    return {"model": model, "messages": messages, "max_tokens": 5, "temperature": 0,
            "logprobs": True}


def test_a_pool_switch_demotes_the_cache_and_a_switch_back_restores_it(tmp_path):
    snapshots = library_hub(tmp_path / "hf" / "hub", MODELS)
    proc = serve("--isolate", "--model-pool", "2", "--ssd-cache", tmp_path / "ssd",
                 "--model", LLAMA, env=library_env(tmp_path), ready="/engine", timeout=300)

    def post(model, messages):
        r = httpx.post(proc.base + "/v1/chat/completions", json=body(model, messages),
                       timeout=300)
        assert r.status_code == 200, r.text
        return r.json()

    with proc:
        first = post(LLAMA, HISTORY)
        post(QWEN, HISTORY)
        post(THIRD, HISTORY)  # two engines fit: the least recently used (llama) drains
        # the eviction runs once THIRD's request has ended: wait for its drain to report
        deadline = time.time() + 120
        while True:
            pool = httpx.get(proc.base + "/engine", timeout=30).json()["pool"]
            if pool["demotions"] or time.time() > deadline:
                break
            time.sleep(0.2)
        assert pool["evictions"] == 1 and pool["demotions"] >= 1
        assert {e["model"] for e in pool["resident"]} == {QWEN, THIRD}
        follow = HISTORY + [{"role": "assistant",
                             "content": first["choices"][0]["message"]["content"]},
                            {"role": "user", "content": "And the mountains?"}]
        back = post(LLAMA, follow)  # a fresh llama engine: its RAM is empty
        assert back["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    plain = Engine.load(str(snapshots[LLAMA]), progress=False, prompt_cache_bytes=0)
    try:
        want = token_ids(engine_reply(plain, body(LLAMA, follow)))
    finally:
        close(plain)
    assert [e["id"] for e in back["choices"][0]["logprobs"]["content"]] == want
