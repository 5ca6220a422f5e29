"""Mixed-precision and rotated KV (``--kv-quant config`` and ``turbo[:kXvY]``).

``config``: each layer keeps the bits kv_config.json gives its cache index. Greedy output
on every lane equals mlx-lm's own loop with per-layer ``QuantizedKVCache`` conversion
(mlx-optiq's way: ``maybe_quantize_kv_cache`` converting each layer at its own bits,
written here against mlx-lm alone); each layer's attention output stays within its
bits' error bound of the float reference. ``turbo``: on keys with outlier channels the
rotated cache's attention error is lower than the same bits unrotated; generation runs
on every lane and a row crosses between the pool and a single-sequence cache unchanged.
"""

from __future__ import annotations

import json
import sys

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step
from mlx_lm.models.base import scaled_dot_product_attention
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache

from mlxbun_core import kvquant
from mlxbun_core.engine.core import Engine
from mlxbun_core.kvquant.config import parse_rules
from mlxbun_core.kvquant.turbo import TurboKVCache
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close, greedy, lane_replies, token_ids

LAYERS = 4
# layer 0 at 8 bits, a group of two at 4, layer 3 left out (float), as optiq leaves it
CONFIG = [{"layer_idx": 0, "bits": 8, "group_size": 64}, {"layers": "1-2", "bits": 4}]
BITS = {0: 8, 1: 4, 2: 4}
PROMPTS = ["Once upon a time", "The quick brown fox jumps over the lazy dog and then", "Hi"]
N = 12


@pytest.fixture(scope="module")
def llama():
    path = tiny_checkpoint("llama", seed=0, dtype="float32",
                           config_overrides={"head_dim": 64, "num_hidden_layers": LAYERS})
    return str(path), mlx_load(str(path))


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    f = tmp_path_factory.mktemp("kvcfg") / "kv_config.json"
    f.write_text(json.dumps(CONFIG))
    return f


@pytest.fixture
def per_layer_mlx_lm(monkeypatch):
    """mlx-lm's generate loop converting each layer at its own bits (mlx-optiq's
    install_mixed_kv), through mlx-lm's ``KVCache.to_quantized`` only."""
    gen = sys.modules["mlx_lm.generate"]

    def convert(cache, quantized_kv_start, kv_group_size, kv_bits):
        for i, c in enumerate(cache):
            if type(c) is KVCache and i in BITS and c.keys is not None:
                cache[i] = c.to_quantized(group_size=64, bits=BITS[i])

    monkeypatch.setattr(gen, "maybe_quantize_kv_cache", convert)


def reference(ref, text: str, n: int = N, kv_bits=None) -> tuple[list, list]:
    model, tok = ref
    ids, lps = [], []
    for t, lp in generate_step(mx.array(tok.encode(text)), model, max_tokens=n,
                               kv_bits=kv_bits, quantized_kv_start=0):
        ids.append(int(t))
        lps.append(lp[int(t)].item())
        if int(t) in tok.eos_token_ids:
            break
    return ids, lps


def assert_same(reply, want: tuple) -> None:
    ids, lps = want
    assert token_ids(reply) == ids
    assert [e["logprob"] for e in reply.finish.logprobs] == pytest.approx(lps, abs=1e-4)


def run_lanes(path: str, kv: str, bodies: list) -> dict:
    """Replies of a lone batch stream, batched rows and the serial lane under ``kv``."""
    batched = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0, kv_quant=kv)
    serial = Engine.load(path, progress=False, batch=1, prompt_cache_bytes=0, kv_quant=kv)
    try:
        return {"lone": lane_replies(batched, bodies[:1], [0]),
                "rows": lane_replies(batched, bodies, [0] * len(bodies)),
                "serial": lane_replies(serial, bodies, [0] * len(bodies))}
    finally:
        close(batched, serial)


# ---------------------------------------------------------------- config

def test_config_lanes_equal_mlx_lm_per_layer(llama, config_file, per_layer_mlx_lm):
    """Every lane decodes as mlx-lm's loop with each layer's QuantizedKVCache at its own
    bits: a lone stream, rows batched together (padding), the serial lane."""
    path, ref = llama
    want = [reference(ref, p, kv_bits=8) for p in PROMPTS]  # (8: makes the hook run)
    got = run_lanes(path, f"config:{config_file}", [greedy(p, N) for p in PROMPTS])
    assert_same(got["lone"][0], want[0])
    for lane in ("rows", "serial"):
        for reply, w in zip(got[lane], want):
            assert_same(reply, w)


def test_config_stores_each_layer_at_its_bits(llama, config_file):
    """The pool's stores and a single sequence's caches hold the bits the file names;
    the layer the file leaves out keeps float32; /stats counts them."""
    path, ref = llama
    eng = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0,
                      kv_quant=f"config:{config_file}")
    try:
        stats = eng.kv_quant_stats()
        assert stats["mode"] == "mixed (kv_config.json)"
        assert stats["layers"] == {"kv8": 1, "kv4": 2, "float32": 1}
        assert stats["config"] == str(config_file)
    finally:
        close(eng)
    cache = make_prompt_cache(ref[0])
    ref[0](mx.array([[5, 6, 7]]), cache=cache)
    kvquant.quantize(cache, kvquant.parse(f"config:{config_file}"))
    assert [getattr(c, "bits", None) for c in cache] == [8, 4, 4, None]


def _layer_kv(model, prompt: list) -> list:
    """Each layer's float keys and values after a prompt (a real forward pass)."""
    cache = make_prompt_cache(model)
    model(mx.array([prompt]), cache=cache)
    return [(c.keys[..., :c.offset, :], c.values[..., :c.offset, :]) for c in cache]


def _attention_error(cache, keys, values, queries) -> float:
    """Max abs difference of attention over ``cache`` (holding ``keys``/``values``,
    converted) against the float reference, for new ``queries``."""
    scale = keys.shape[-1] ** -0.5
    want = scaled_dot_product_attention(queries, keys, values, cache=None, scale=scale,
                                        mask=None)
    if isinstance(cache, TurboKVCache):
        k, v = cache.fetch()
        got = scaled_dot_product_attention(queries, k, v, cache=None, scale=scale, mask=None)
    else:
        qk, qv = cache.keys_and_values()
        got = scaled_dot_product_attention(queries, qk, qv, cache=cache, scale=scale, mask=None)
    return mx.abs(got - want).max().item()


def _bound(values: mx.array, bits: int) -> float:
    """The bits' tolerance: a quantization step of the widest value group (a value is
    off by at most half a step, the keys' error moves the weights by a like amount)."""
    groups = values.reshape(*values.shape[:-1], -1, 64)
    width = (groups.max(axis=-1) - groups.min(axis=-1)).max().item()
    return width / (2 ** bits - 1)


def test_each_layers_attention_error_within_its_bits(llama, config_file):
    """Per layer, attention over the config's converted cache stays within that layer's
    bits' tolerance of the float cache; the 8-bit layer's error is the smallest, the
    float layer's zero."""
    path, ref = llama
    model = ref[0]
    kv = _layer_kv(model, list(range(5, 69)))
    scheme = kvquant.parse(f"config:{config_file}")
    queries = mx.random.normal((1, 4, 3, 64), key=mx.random.key(1))
    errors = []
    for i, (k, v) in enumerate(kv):
        c = KVCache()
        c.update_and_fetch(k, v)
        cache = kvquant.quantize([c], kvquant.KVScheme(rules=((0, BITS.get(i, 0), 64),)))[0]
        err = _attention_error(cache, k, v, queries)
        if i in BITS:
            assert isinstance(cache, QuantizedKVCache) and cache.bits == scheme.layer(i).keys
            assert 0 < err <= _bound(v, BITS[i]), (i, err)
        else:
            assert err == 0
        errors.append(err)
    assert errors[0] < min(errors[1], errors[2])


@pytest.mark.parametrize("raw,why", [
    ({"layer_idx": 0, "bits": 4}, "JSON list"),
    ([{"layer_idx": 0, "bits": 7}], "bits must be one of"),
    ([{"layer_idx": 0, "bits": 4, "group_size": 48}], "group_size"),
    ([{"bits": 4}], "layer_idx"),
    ([{"layer_idx": 1, "bits": 4}, {"layers": "0-1", "bits": 8}], "named twice"),
])
def test_a_bad_kv_config_says_what_is_wrong(raw, why):
    with pytest.raises(ValueError, match=why):
        parse_rules(raw)


def test_a_missing_or_bad_config_is_a_start_up_refusal(llama, tmp_path, capsys):
    """`serve --kv-quant config` on a model without kv_config.json, or with a broken
    one, exits 2 with the reason; --kv-quant's syntax is checked at parse time."""
    from mlxbun_core.cli import main

    path, _ = llama
    assert main(["serve", path, "--kv-quant", "config", "--port", "0"]) == 2
    assert "kv_config.json does not exist" in capsys.readouterr().err
    bad = tmp_path / "kv_config.json"
    bad.write_text('[{"layer_idx": 0, "bits": 9}]')
    assert main(["serve", path, "--kv-quant", f"config:{bad}", "--port", "0"]) == 2
    assert "bits must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", path, "--kv-quant", "turbo:k7v3", "--port", "0"])
    assert "key bits must be one of" in capsys.readouterr().err


# ---------------------------------------------------------------- turbo

def _outlier_keys(seed: int) -> tuple[mx.array, mx.array, mx.array]:
    """Keys whose channels 3 and 40 run 8x the rest (as real keys' outlier channels
    do), ordinary values, and 32 queries per head."""
    channel = mx.arange(64)
    k = mx.random.normal((1, 2, 128, 64), key=mx.random.key(seed))
    k = k * mx.where((channel == 3) | (channel == 40), 8.0, 1.0)
    v = mx.random.normal((1, 2, 128, 64), key=mx.random.key(seed + 100))
    q = mx.random.normal((1, 4, 32, 64), key=mx.random.key(seed + 200))
    return k, v, q


def _rms_error(cache, keys, values, queries) -> float:
    """Root-mean-square difference of attention over ``cache`` from the float one."""
    want = scaled_dot_product_attention(queries, keys, values, cache=None, scale=0.125,
                                        mask=None)
    if isinstance(cache, TurboKVCache):
        k, v = cache.fetch()
        got = scaled_dot_product_attention(queries, k, v, cache=None, scale=0.125, mask=None)
    else:
        qk, qv = cache.keys_and_values()
        got = scaled_dot_product_attention(queries, qk, qv, cache=cache, scale=0.125,
                                           mask=None)
    return mx.sqrt(mx.mean((got - want) ** 2)).item()


@pytest.mark.parametrize("bits", [4, 3])
def test_rotation_lowers_the_error_on_outlier_keys(bits):
    """Same bits for keys and values: the rotated cache's keys are closer to the float
    keys and its attention closer to float attention than mlx-lm's unrotated
    QuantizedKVCache's (measured: 0.4-0.6x), at the same bytes."""
    for seed in (0, 1, 2):
        k, v, q = _outlier_keys(seed)
        plain = QuantizedKVCache(group_size=64, bits=bits)
        plain.update_and_fetch(k, v)
        turbo = TurboKVCache(bits, bits, 64)
        turbo.update_and_fetch(k, v)
        plain_keys = mx.dequantize(*plain.keys_and_values()[0], group_size=64, bits=bits)
        turbo_keys = turbo.fetch()[0]
        assert mx.mean((turbo_keys - k) ** 2).item() < mx.mean((plain_keys - k) ** 2).item()
        rotated, unrotated = _rms_error(turbo, k, v, q), _rms_error(plain, k, v, q)
        assert rotated < 0.8 * unrotated, (seed, rotated, unrotated)
        assert turbo.nbytes == plain.nbytes


def test_turbo_lanes_agree_and_differ_from_float(llama):
    """turbo:k4v4 decodes on every lane, the batch's pool and the single-sequence cache
    alike (same tokens and log-probs); it is not the float model's output."""
    path, ref = llama
    bodies = [greedy(p, N) for p in PROMPTS]
    got = run_lanes(path, "turbo:k4v4", bodies)
    serial = [(token_ids(r), [e["logprob"] for e in r.finish.logprobs]) for r in got["serial"]]
    assert_same(got["lone"][0], serial[0])
    for reply, w in zip(got["rows"], serial):
        assert_same(reply, w)
    floats = [reference(ref, p) for p in PROMPTS]
    assert [s[1] for s in serial] != [f[1] for f in floats]


def test_a_turbo_row_crosses_to_a_single_sequence_cache(llama):
    """A prefix-cache hit under turbo continues from the rotated entry: the same reply
    as without the cache."""
    path, _ = llama
    eng = Engine.load(path, progress=False, batch=8, kv_quant="turbo:k8v4")
    cold = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0,
                       kv_quant="turbo:k8v4")
    try:
        text = "Once upon a time " * 6
        first = lane_replies(eng, [greedy(text, 6)], [0])[0]
        again = lane_replies(eng, [greedy(text + "there", 6)], [0])[0]
        assert again.finish.usage.cached_tokens > 0
        want = lane_replies(cold, [greedy(text + "there", 6)], [0])[0]
        assert token_ids(again) == token_ids(want)
        assert token_ids(first)
    finally:
        close(eng, cold)


def test_turbo_parse_and_stats(llama):
    assert kvquant.parse("turbo").turbo == (8, 3)
    s = kvquant.parse("turbo:k4v2")
    assert (s.flag, s.mode(), s.name) == ("turbo:k4v2", "turbo k4v2", "kv:turbo-k4v2:g64")
    with pytest.raises(ValueError):
        kvquant.parse("turbo:4")
    path, _ = llama
    eng = Engine.load(path, progress=False, batch=8, prompt_cache_bytes=0,
                      kv_quant="turbo:k4v4")
    try:
        stats = eng.kv_quant_stats()
        assert stats["mode"] == "turbo k4v4"
        assert stats["layers"] == {"turbo-k4v4": LAYERS, "float32": 0}
    finally:
        close(eng)
