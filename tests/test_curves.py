"""The Curve Designer's backends over real HTTP (POST /signal, POST /generate), its pages,
and the lab's legacy paths, on a tiny random checkpoint."""

from __future__ import annotations

import httpx
import mlx.core as mx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.webapp.curves import BINS, histogram, looks_like_junk

STEEP = [[-20, -20000], [0, 0]]  # so steep it is argmax: every sample the same


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


def post(srv, path, **body) -> httpx.Response:
    return httpx.post(srv.base_url + path, json=body, timeout=120)


def test_signal_bins_the_next_token_distribution(srv):
    r = post(srv, "/signal", prompt="Once upon a time")
    assert r.status_code == 200, r.text
    assert "access-control-allow-origin" not in r.headers  # --cors decides (test_cross_site)
    data = r.json()
    vocab = srv.engine.model.model.args.vocab_size
    assert data["vocab"] == vocab and len(data["bins"]) == BINS
    assert sum(data["bins"]) == vocab  # every token in some bucket
    # a near-uniform random model: the mass sits around log(1/V), not at 0
    expected = int((mx.log(mx.array(1 / vocab)).item() + 20) / 20 * BINS)
    peak = max(range(BINS), key=data["bins"].__getitem__)
    assert abs(peak - expected) <= 3


def test_signal_and_generate_refuse_bad_bodies_in_the_designer_shape(srv):
    bad = httpx.post(srv.base_url + "/signal", content=b"{nope", timeout=30,
                     headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"].startswith("invalid JSON")
    assert post(srv, "/signal").status_code == 400
    for body in ({"prompt": "x", "n": 9}, {"prompt": "x", "max_tokens": 0},
                 {"prompt": "x", "curve": "up"}, {"prompt": ""}):
        r = post(srv, "/generate", **body)
        assert r.status_code == 400 and isinstance(r.json()["error"], str), body
    r = post(srv, "/generate", prompt="x", curve={"points": [[-20, -20], [-10, 0], [0, -5]]})
    assert r.status_code == 400 and "not monotone" in r.json()["error"]
    assert post(srv, "/generate", prompt="x", n=1, max_tokens=2).status_code == 200


def test_generate_with_the_curve_and_with_the_default_recipe(srv):
    curved = post(srv, "/generate", prompt="hello", n=3, max_tokens=8, curve={"points": STEEP})
    assert curved.status_code == 200, curved.text
    data = curved.json()
    assert data["mode"] == "curve" and "recipe" not in data and data["n"] == 3
    steep = [s["text"] for s in data["samples"]]
    identity = post(srv, "/generate", prompt="hello", n=3, max_tokens=8,
                    curve={"points": [[-20, -20], [0, 0]]}).json()["samples"]
    # the identity curve is plain sampling at T = 1, sample i with seed + i
    for i, sample in enumerate(identity):
        chat = post(srv, "/v1/chat/completions", messages=[{"role": "user", "content": "hello"}],
                    max_tokens=8, temperature=1.0, seed=i).json()
        assert sample["text"] == chat["choices"][0]["message"]["content"]
    assert steep != [s["text"] for s in identity]  # the drawn curve changed the samples
    plain = post(srv, "/generate", prompt="hello", n=3, max_tokens=8, curve={"points": STEEP},
                 default=True).json()
    assert plain["mode"] == "default" and plain["recipe"]["temperature"] > 0
    assert len({s["text"] for s in plain["samples"]}) > 1  # seed + i per sample
    assert all(isinstance(s["junk"], bool) for s in plain["samples"])
    again = post(srv, "/generate", prompt="hello", n=3, max_tokens=8, default=True).json()
    assert again["samples"] == plain["samples"]  # seeded: repeatable


def test_options_preflight_and_pages(srv):
    r = httpx.options(srv.base_url + "/generate")
    assert r.status_code == 204 and r.headers["allow"] == "POST, OPTIONS"
    # a browser's preflight from another site: only a --cors site gets one
    r = httpx.options(srv.base_url + "/generate", headers={
        "origin": "http://evil.example", "access-control-request-method": "POST"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    for page in ("/curves", "/curve-terrain", "/dag"):
        r = httpx.get(srv.base_url + page)
        assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
        assert r.headers["content-type"].startswith("text/html")
    assert "/assets/curves.js" in httpx.get(srv.base_url + "/curves").text
    for route in ("quantize", "finetune", "dataset", "memory"):
        r = httpx.get(f"{srv.base_url}/{route}")
        assert r.status_code == 302 and r.headers["location"] == f"/#{route}"


def test_histogram_and_junk_heuristic():
    assert histogram([0.0, -0.1, -19.99, -50.0, float("-inf")], bins=4) == [2, 0, 0, 2]
    assert looks_like_junk("") and looks_like_junk("\ufffd\ufffd ab")
    assert looks_like_junk("the the the the the the the the the")
    assert looks_like_junk("#$%^&*()!@#$%^&*")
    assert not looks_like_junk("The sea was calm and grey that morning.")
