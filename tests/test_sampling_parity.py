"""Seeded sampling at temperature > 0 equals mlx-lm's own sampler and logits processors.

The server runs with a seed; the reference is mlx-lm's ``generate_step`` with
``make_sampler`` / ``make_logits_processors`` under the same seed, on the same tiny
checkpoint. Every case also checks that dropping any one of its parameters changes the
reference tokens, so a server that ignored that parameter would fail the test.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import mlx.core as mx
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from mlxbun_core.testing.checkpoints import tiny_checkpoint

PROMPT = "Once upon a time"
N = 16
SEED = 5
SAMPLER = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
           "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold"}
# a handful of strongly favoured tokens: sampled text repeats, so penalties and their
# context sizes decide tokens
FEW = {str(i): 8.0 for i in range(300, 308)}


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def ref(ckpt):
    return mlx_load(str(ckpt))


def served(srv, path="/completions", **body) -> dict:
    body = {"prompt": PROMPT, "max_tokens": N, "seed": SEED, "logprobs": True, **body}
    r = httpx.post(srv.v1 + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def served_ids(srv, **body) -> list[int]:
    return [e["id"] for e in served(srv, **body)["choices"][0]["logprobs"]["content"]]


def reference(ref, params: dict, prompt_tokens=None, seed=SEED, n=N):
    """mlx-lm's decode loop as mlx_lm.server sets it up; returns [(token, logprobs)]."""
    model, tok = ref
    skw = {SAMPLER[k]: v for k, v in params.items() if k in SAMPLER}
    pkw = {k: v for k, v in params.items() if k not in SAMPLER}
    if "logit_bias" in pkw:
        pkw["logit_bias"] = {int(k): float(v) for k, v in pkw["logit_bias"].items()}
    sampler = make_sampler(**skw, xtc_special_tokens=tok.encode("\n") + list(tok.eos_token_ids))
    procs = make_logits_processors(**pkw)
    prompt = mx.array(prompt_tokens if prompt_tokens is not None else tok.encode(PROMPT))
    mx.random.seed(seed)
    out = []
    for t, lp in generate_step(prompt, model, max_tokens=n, sampler=sampler,
                               logits_processors=procs):
        out.append((int(t), lp))
        if t in tok.eos_token_ids:
            break
    return out


def ref_ids(ref, params, **kw) -> list[int]:
    return [t for t, _ in reference(ref, params, **kw)]


def detokenized(tok, ids) -> str:
    """The text mlx_lm.server would send for ``ids`` (its streaming detokenizer; EOS dropped)."""
    detok = tok.detokenizer
    for t in ids:
        if t not in tok.eos_token_ids:
            detok.add_token(t)
    detok.finalize()
    return detok.text


CASES = {
    "temperature": {"temperature": 0.7},
    "top_k": {"temperature": 1.0, "top_k": 5},
    "min_p": {"temperature": 1.0, "min_p": 0.5},
    "top_p": {"temperature": 1.0, "top_p": 0.5},
    "xtc": {"temperature": 1.0, "xtc_probability": 1.0, "xtc_threshold": 0.01},
    "logit_bias": {"temperature": 1.0, "logit_bias": {"300": 5.0}},
    "repetition": {"temperature": 1.0, "logit_bias": FEW, "repetition_penalty": 3.0,
                   "repetition_context_size": 3},
    "presence": {"temperature": 1.0, "logit_bias": FEW, "presence_penalty": 1.0,
                 "presence_context_size": 5},
    "frequency": {"temperature": 1.0, "logit_bias": FEW, "frequency_penalty": 1.0,
                  "frequency_context_size": 5},
}


@pytest.mark.parametrize("params", CASES.values(), ids=CASES.keys())
def test_seeded_tokens_equal_mlx_lm(srv, ref, params):
    ours = served_ids(srv, **params)
    assert ours == ref_ids(ref, params)
    for name in params:  # each parameter matters here: ignoring it would change the tokens
        without = {k: v for k, v in params.items() if k != name}
        assert ref_ids(ref, without) != ours, f"{name} does not change the tokens"


def test_all_sampler_extras_together(srv, ref):
    params = {"temperature": 0.9, "top_k": 40, "top_p": 0.95, "min_p": 0.2,
              "xtc_probability": 0.5, "xtc_threshold": 0.01, "logit_bias": {"77": 1.5},
              "repetition_penalty": 1.3, "repetition_context_size": 8,
              "presence_penalty": 0.4, "presence_context_size": 10,
              "frequency_penalty": 0.3, "frequency_context_size": 12}
    assert served_ids(srv, **params) == ref_ids(ref, params)
    assert served_ids(srv, **params, seed=SEED + 1) == ref_ids(ref, params, seed=SEED + 1)


def test_penalty_kinds_are_not_interchangeable(ref):
    """Presence counts a token once, frequency per occurrence: on repeating text they differ,
    so the frequency case above would catch a server that applied one for the other."""
    common = {"temperature": 1.0, "logit_bias": FEW}
    presence = ref_ids(ref, {**common, "presence_penalty": 1.0, "presence_context_size": 5})
    frequency = ref_ids(ref, {**common, "frequency_penalty": 1.0, "frequency_context_size": 5})
    assert presence != frequency


CHAT = {"temperature": 1.0, "top_k": 5, "min_p": 0.5}


def chat_prompt(tok, messages):
    """The prompt built by mlx-lm's tokenizer wrapper, independently of our engine."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)


def test_chat_surface_samples_like_mlx_lm(srv, ref):
    model, tok = ref
    messages = [{"role": "user", "content": "Tell me a story."}]
    body = served(srv, "/chat/completions", messages=messages, **CHAT)
    ours = [e["id"] for e in body["choices"][0]["logprobs"]["content"]]
    prompt = chat_prompt(tok, messages)
    assert ours == ref_ids(ref, CHAT, prompt_tokens=prompt)
    for name in ("top_k", "min_p"):
        without = {k: v for k, v in CHAT.items() if k != name}
        assert ours != ref_ids(ref, without, prompt_tokens=prompt)


def test_anthropic_surface_passes_top_k_and_min_p(srv, ref):
    """Anthropic has no logprobs: the text must be mlx-lm's tokens, detokenized."""
    model, tok = ref
    messages = [{"role": "user", "content": "Tell me a story."}]
    client = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    msg = client.messages.create(model="m", max_tokens=N, messages=messages,
                                 extra_body={**CHAT, "seed": SEED})
    prompt = chat_prompt(tok, messages)

    def text_of(params):
        return detokenized(tok, ref_ids(ref, params, prompt_tokens=prompt))

    text = "".join(b.text for b in msg.content if b.type == "text")
    assert text == text_of(CHAT)
    for name in ("top_k", "min_p"):
        assert text != text_of({k: v for k, v in CHAT.items() if k != name})


# -- logprobs at temperature > 0 ---------------------------------------------------

def test_logprobs_entry_is_the_sampled_token(srv, ref):
    """``logprobs`` alone: each entry is the token that was sampled, with its own log-prob
    under the processed distribution (not the most likely token's)."""
    params = {"temperature": 1.0, "repetition_penalty": 1.5}
    entries = served(srv, **params)["choices"][0]["logprobs"]["content"]
    steps = reference(ref, params)
    assert [e["id"] for e in entries] == [t for t, _ in steps]
    for e, (t, lp) in zip(entries, steps):
        assert e["logprob"] == pytest.approx(lp[t].item(), abs=1e-5)
    assert any(t != int(mx.argmax(lp).item()) for t, lp in steps), "needs a non-argmax sample"


def test_top_logprobs_entry_is_the_sampled_token(srv, ref):
    """With ``top_logprobs`` the entry is still the token that was output (OpenAI's shape),
    followed by the k most likely tokens, sorted: at temperature > 0 the two differ."""
    params = {"temperature": 1.0, "repetition_penalty": 1.5}
    choice = served(srv, **params, top_logprobs=3)["choices"][0]
    entries = choice["logprobs"]["content"]
    steps = reference(ref, params)
    assert [e["id"] for e in entries] == [t for t, _ in steps]
    for e, (t, lp) in zip(entries, steps):
        assert e["logprob"] == pytest.approx(lp[t].item(), abs=1e-5)
        best = sorted(range(lp.shape[0]), key=lambda i: -lp[i].item())[:3]
        assert [x["id"] for x in e["top_logprobs"]] == best
        for x in e["top_logprobs"]:
            assert x["logprob"] == pytest.approx(lp[x["id"]].item(), abs=1e-5)
    _, tok = ref
    assert choice["text"] == detokenized(tok, [t for t, _ in steps])
    assert any(e["id"] != e["top_logprobs"][0]["id"] for e in entries), "needs a non-argmax sample"


def strict_json(raw: bytes):
    """JSON as every client parses it: NaN / Infinity are not JSON."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(raw, parse_constant=refuse)


def test_masked_tokens_keep_logprobs_valid_json(srv):
    """A grammar masks most of the vocabulary to -inf: top_logprobs then lists masked tokens,
    whose log-prob must still be a JSON number (OpenAI's floor, -9999.0)."""
    r = httpx.post(srv.v1 + "/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 4, "temperature": 1.0, "seed": SEED, "top_logprobs": 5,
        "guided_choice": ["yes", "no"]})
    assert r.status_code == 200 and "warning" not in r.headers
    choice = strict_json(r.content)["choices"][0]
    assert choice["text"] in ("yes", "no")
    tops = [t["logprob"] for e in choice["logprobs"]["content"] for t in e["top_logprobs"]]
    assert -9999.0 in tops and all(-9999.0 <= v <= 0 for v in tops)
