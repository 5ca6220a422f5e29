"""The plain-ops attention for short queries (engine/attention_route.py): the same numbers
as MLX's fused function for every mask form, and a model decodes the same tokens through it."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step

from mlxbun_core.engine import attention_route as route
from mlxbun_core.testing.checkpoints import tiny_checkpoint


def qkv(b: int, hq: int, hk: int, n: int, s: int, d: int = 32, dtype=mx.float32):
    mx.random.seed(b * 1000 + hq * 100 + n + s)
    return (mx.random.normal((b, hq, n, d)).astype(dtype),
            mx.random.normal((b, hk, s, d)).astype(dtype),
            mx.random.normal((b, hk, s, d)).astype(dtype))


def masks(b: int, hq: int, n: int, s: int) -> list:
    keep = mx.random.uniform(shape=(b, 1, n, s)) > 0.3
    keep = keep | (mx.arange(s) == s - 1)  # every query keeps one key
    per_head = mx.random.uniform(shape=(b, hq, n, s)) > 0.3
    per_head = per_head | (mx.arange(s) == 0)
    return [None, "causal", keep, mx.where(keep, 0.0, -1e9), per_head,
            mx.where(per_head, 0.0, -1e9), keep[:, :, :1], keep[0, 0]]


@pytest.mark.parametrize("b,hq,hk,n,s", [(1, 8, 2, 5, 40), (2, 8, 8, 3, 17),
                                         (3, 9, 3, 7, 300), (1, 4, 1, 2, 2)])
def test_matches_the_fused_function_for_every_mask_form(b, hq, hk, n, s):
    q, k, v = qkv(b, hq, hk, n, s)
    for mask in masks(b, hq, n, s):
        want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.3, mask=mask)
        got = route.attention(q, k, v, scale=0.3, mask=mask)
        assert got.shape == want.shape
        assert mx.allclose(got, want, atol=1e-5).item(), (
            None if mask is None else mask if isinstance(mask, str) else mask.shape)


def test_values_narrower_than_keys():  # multi-head latent attention (GLM, DeepSeek)
    q, k, _ = qkv(1, 8, 8, 4, 30, d=48)
    v = mx.random.normal((1, 8, 30, 16))
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask="causal")
    got = route.attention(q, k, v, scale=0.2, mask="causal")
    assert got.shape == (1, 8, 4, 16) and mx.allclose(got, want, atol=1e-5).item()


def test_bfloat16_stays_close():
    q, k, v = qkv(1, 8, 2, 6, 500, d=64, dtype=mx.bfloat16)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    got = route.attention(q, k, v, scale=0.125, mask="causal")
    assert got.dtype == mx.bfloat16
    assert mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item() < 2e-2


def test_only_short_queries_take_the_route():
    k = mx.zeros((1, 8, 4096, 128))
    assert not route.short(mx.zeros((1, 32, 1, 128)), k)  # decode keeps the vector kernel
    assert route.short(mx.zeros((1, 32, 2, 128)), k)
    assert route.short(mx.zeros((1, 32, route.MAX_QUERY, 128)), k)
    assert not route.short(mx.zeros((1, 32, route.MAX_QUERY + 1, 128)), k)  # a prefill
    huge = mx.zeros((1, 8, route.MAX_SCORES // (32 * 64) + 1, 128))
    assert not route.short(mx.zeros((1, 32, 64, 128)), huge)  # scores too big to spell out


def test_auto_routes_bfloat16_only_and_on_routes_every_dtype(monkeypatch):
    k = mx.zeros((1, 2, 64, 32))
    for mode, want in (("auto", {mx.bfloat16}), ("on", {mx.bfloat16, mx.float16, mx.float32})):
        monkeypatch.setattr(route, "_dtypes", route.dtypes_for(mode))
        routed = {dt for dt in (mx.bfloat16, mx.float16, mx.float32)
                  if route.short(mx.zeros((1, 8, 4, 32), dtype=dt), k)}
        assert routed == want, mode


def test_modes():
    assert route.parse_mode(None) == "auto" and route.parse_mode("1") == "on"
    assert route.parse_mode("OFF") == "off"
    with pytest.raises(ValueError, match="MLXBUN_SHORT_ATTENTION"):
        route.parse_mode("sometimes")
    assert route.wanted("on") and not route.wanted("off")
    assert route.wanted("auto") == bool(mx.cuda.is_available())


def test_a_model_decodes_the_same_tokens_through_the_route():
    model, tok = load(str(tiny_checkpoint("llama")))
    prompt = mx.array(tok.encode("the short route " * 20))

    def greedy() -> list[int]:
        return [t for t, _ in zip((int(t) for t, _ in generate_step(
            prompt, model, max_tokens=24, prefill_step_size=7)), range(24))]

    plain = greedy()
    assert route.install("on")
    try:
        assert mx.fast.scaled_dot_product_attention is route._route
        assert route.install("on")  # idempotent
        routed = greedy()
    finally:
        route.uninstall()
    assert mx.fast.scaled_dot_product_attention is not route._route
    assert routed == plain
