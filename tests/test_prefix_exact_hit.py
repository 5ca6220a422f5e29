"""The prefix cache's exact hit: a prompt whose every token is cached still feeds its
last token, once, so the first logits equal a cold start's (this branch of the lookup
ran nowhere else in the suite)."""

from __future__ import annotations

import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, run_all, token_ids


@pytest.mark.parametrize("batch", [8, 1], ids=["batched", "serial"])
@pytest.mark.parametrize("model_type", ["llama", "qwen3_5"])
def test_an_exact_hit_feeds_the_last_token_once(model_type, batch):
    """A prompt equal to a cached entry (the KV of every one of its tokens): the lane
    must start from all but the last token and feed that one, so the first logits are a
    cold start's. A trimmable cache is cut back by one; one that cannot rewind (Qwen3.5)
    is served from the entry one token shorter (the prompt-boundary snapshot)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    path = str(tiny_checkpoint(model_type))
    cached = Engine.load(path, progress=False, batch=batch)
    plain = Engine.load(path, progress=False, batch=batch, prompt_cache_bytes=0)
    try:
        body = {"prompt": "The sea and the sky meet at the edge of the world " * 3,
                "max_tokens": 6, "temperature": 0, "logprobs": True}
        req = cached.parse_completion(body)
        tokens = cached.model.tokenizer.encode(req.prompt)
        namespace = cached.cache_namespace(req)

        def kv_of(ids):
            cache = make_prompt_cache(cached.model.model)
            cached.model.model(mx.array(ids)[None], cache=cache)
            mx.eval([c.state for c in cache])
            return cache

        def seed():
            cached.prefix.store(namespace, tokens, kv_of(tokens))
            cached.prefix.store(namespace, tokens[:-1], kv_of(tokens[:-1]), boundary=True)

        cached.worker.run_sync(seed)
        assert cached.prefix.holds(namespace, tokens)
        hit, cold = run_all(cached, [body])[0], run_all(plain, [body])[0]
        assert hit.finish.usage.cached_tokens == len(tokens) - 1
        assert token_ids(hit) == token_ids(cold)
        first_hit, first_cold = hit.finish.logprobs[0], cold.finish.logprobs[0]
        assert abs(first_hit["logprob"] - first_cold["logprob"]) < 1e-3
    finally:
        close(cached, plain)
