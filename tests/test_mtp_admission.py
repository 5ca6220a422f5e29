"""Memory admission bills the MTP head: a row drafting with the checkpoint's head
(``draft_kind: "mtp"``) reserves its worst-case KV plus the head's cache, a row per token
of that same worst case (the predictor's ``kv_bytes_per_token``), on the batch lane, a
lone stream and the serial lane; a budget that holds two plain rows together makes two
MTP rows of the same size take turns (``memory_waits``). The head's weights count as
weights once resident (at start under ``--draft-kind mtp``, or after the first MTP
request), and an MTP request is held to the context that fits with the head's weights and
cache: refused with each surface's 400 when its prompt leaves no room there, its broad
``max_tokens`` clamped to it.

Real servers over the tiny Qwen3.5 checkpoint with a ``"copy"`` head and a budget of
exactly ``CONTEXT`` tokens of target KV once the head's weights are resident (as in
test_admission.py).
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core.engine.speculate import server_config
from mlxbun_core.library import fit
from mlxbun_core.library.checkpoint import safetensors_header
from mlxbun_core.models.facts import weight_bytes
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import prompt_of, together
from mlxbun_core.testing.server import start_server

CONTEXT = 300
MTP, PLAIN = {"draft_kind": "mtp"}, {"draft_kind": "none"}


def head_weight_bytes(path) -> int:
    """The ``mtp.*`` tensors' bytes, from the safetensors headers."""
    return sum(e["data_offsets"][1] - e["data_offsets"][0]
               for f in path.glob("*.safetensors")
               for k, e in safetensors_header(f).items() if k.startswith("mtp."))


@pytest.fixture(scope="module")
def ckpt():
    """The checkpoint, its tokenizer, config, target weight bytes, head weight bytes and a
    budget of the target and head weights plus ``CONTEXT`` tokens of target KV."""
    path = tiny_checkpoint("qwen3_5", mtp="copy", dtype="float32")
    model, tok = mlx_load(str(path))
    config = json.loads((path / "config.json").read_text())
    weights, head = weight_bytes(model), head_weight_bytes(path)
    assert head > 0
    budget = (weights + head + fit.kv_layout(config).bytes_at(CONTEXT)
              + fit.transient_bytes(config, CONTEXT))
    return path, tok, config, weights, head, budget


@pytest.fixture(scope="module")
def srv(ckpt):
    """``--draft-kind mtp``: the head's weights are loaded at start."""
    path, tok, config, *_, budget = ckpt
    s = start_server(path, batch=4, memory_budget_bytes=budget,
                     speculation=server_config("mtp"))
    s.tok, s.config = tok, config
    # every reservation as it is made: (job, bytes reserved)
    adm, reserve, s.reserved = s.engine.admission, s.engine.admission.reserve, []

    def recorded(job):
        reserve(job)
        s.reserved.append((job, job.reserved_bytes))

    adm.reserve = recorded
    yield s
    adm.reserve = reserve
    s.stop()


@pytest.fixture(scope="module")
def lazy(ckpt):
    """No ``--draft-kind``: the head's weights load with the first MTP request."""
    path, tok, *_, budget = ckpt
    s = start_server(path, batch=4, memory_budget_bytes=budget)
    s.tok = tok
    yield s
    s.stop()


def post(srv, prompt: str, max_tokens: int, extra: dict) -> httpx.Response:
    """A greedy completion (an MTP one drafts on the batch lane, logits processors or not)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    return httpx.post(srv.v1 + "/completions", json=body, timeout=120)


def complete(srv, prompt: str, max_tokens: int, extra: dict) -> dict:
    r = post(srv, prompt, max_tokens, extra)
    assert r.status_code == 200, r.text
    return r.json()


def refused(r: httpx.Response) -> dict:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("memory_admission", "context_over_budget")
    return err


def admission(srv) -> dict:
    return httpx.get(srv.base_url + "/stats").json()["admission"]


def test_an_mtp_row_reserves_the_heads_kv_on_every_lane(srv):
    head = srv.engine.predictor.kv_bytes_per_token
    assert head > 0 and admission(srv)["mtp_head_kv_bytes_per_token"] == head
    layout, prompt = srv.engine.admission.layout, prompt_of(srv.tok, 12)
    runs = {"plain": PLAIN, "lone mtp": MTP, "serial mtp": {**MTP, "seed": 7}}
    got = {}
    for name, extra in runs.items():
        first = len(srv.reserved)
        out = complete(srv, prompt, 20, extra)
        assert out["usage"]["completion_tokens"] == 20
        ((job, reserved),) = srv.reserved[first:]
        got[name] = (job.session.usage.lane, reserved)
    tokens = 12 + 20
    assert got["plain"] == ("batched", layout.bytes_at(tokens))
    assert got["lone mtp"] == ("batched+spec", layout.bytes_at(tokens) + head * tokens)
    assert got["serial mtp"] == ("serial+spec", layout.bytes_at(tokens) + head * tokens)
    assert admission(srv)["reserved_kv_bytes"] == 0  # all released


def test_two_rows_that_fit_plain_take_turns_with_the_head(srv):
    adm = srv.engine.admission
    head, room, layout = adm.head_bytes_per_token, adm.kv_room, adm.layout
    # the longest rows two of which fit together plainly; one MTP row of them fits alone,
    # two do not
    n = max(t for t in range(1, CONTEXT) if 2 * layout.bytes_at(t) <= room)
    assert layout.bytes_at(n) + head * n <= room < 2 * (layout.bytes_at(n) + head * n)
    prompt, tokens = prompt_of(srv.tok, 10), n - 10

    def pair(extra: dict) -> int:
        before = admission(srv)["memory_waits"]
        outs = together(*[lambda: complete(srv, prompt, tokens, extra)] * 2)
        assert [o["usage"]["completion_tokens"] for o in outs] == [tokens] * 2
        return admission(srv)["memory_waits"] - before

    assert pair(PLAIN) == 0
    assert pair(MTP) >= 1
    assert admission(srv)["reserved_kv_bytes"] == 0


def mtp_ceiling(srv, ckpt) -> int:
    """The longest context of a row drafting with the head: the target's KV, the head's
    cache and one prefill's scratch within the budget less both models' weights."""
    _, _, config, weights, head_weights, budget = ckpt
    layout, per = fit.kv_layout(config), srv.engine.predictor.kv_bytes_per_token
    room = budget - weights - head_weights
    return max(t for t in range(1, CONTEXT + 1)
               if layout.bytes_at(t) + per * t + fit.transient_bytes(config, t) <= room)


def test_the_heads_weights_count_from_start_under_draft_kind_mtp(srv, ckpt):
    *_, weights, head_weights, _ = ckpt
    adm = admission(srv)
    assert adm["mtp_head_weights_billed"] is True
    assert adm["mtp_head_weight_bytes"] == head_weights
    assert adm["weights_bytes"] == weights + head_weights
    assert adm["enforced_context_tokens"] == adm["max_safe_context"] == CONTEXT
    assert adm["kv_room_bytes"] == srv.engine.admission.layout.bytes_at(CONTEXT)
    assert adm["mtp_enforced_context_tokens"] == mtp_ceiling(srv, ckpt) < CONTEXT


def test_the_heads_weights_count_once_the_first_mtp_request_loads_them(lazy, ckpt):
    """Before any MTP request the head holds nothing and a plain row has its room; after
    one, the head's weights are billed: the ceiling falls back to CONTEXT, and /fit
    agrees."""
    *_, weights, head_weights, _ = ckpt
    before, loaded_before = admission(lazy), lazy.engine.predictor.loaded
    longer = prompt_of(lazy.tok, CONTEXT + 1)
    ok = post(lazy, longer, 2, PLAIN)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    assert complete(lazy, prompt_of(lazy.tok, 12), 8, MTP)["usage"]["completion_tokens"] == 8
    err = refused(post(lazy, longer, 2, PLAIN))  # the head's weights took that room
    assert f"admits at most {CONTEXT} tokens" in err["message"]
    assert not loaded_before and before["mtp_head_weights_billed"] is False
    assert before["weights_bytes"] == weights
    assert before["enforced_context_tokens"] > CONTEXT + 1
    after = admission(lazy)
    assert lazy.engine.predictor.loaded and after["mtp_head_weights_billed"] is True
    assert after["weights_bytes"] == weights + head_weights
    assert after["enforced_context_tokens"] == after["max_safe_context"] == CONTEXT
    assert after["kv_room_bytes"] == lazy.engine.admission.layout.bytes_at(CONTEXT)
    report = httpx.get(lazy.base_url + "/fit").json()["report"]
    assert report["weights_bytes"] == weights + head_weights
    assert report["max_safe_context"] == CONTEXT


def test_an_mtp_request_that_cannot_fit_is_a_400_on_every_surface(srv, ckpt):
    """A prompt that fits plainly but leaves no room beside the head's cache: refused
    before it starts with each surface's 400 (it was admitted and overran the budget)."""
    ceiling = mtp_ceiling(srv, ckpt)
    prompt = prompt_of(srv.tok, ceiling)
    err = refused(post(srv, prompt, 2, MTP))
    assert f"at most {ceiling} tokens of context for a request drafting with the MTP head" \
        in err["message"] and f'draft_kind "none" admits {CONTEXT}' in err["message"]
    assert post(srv, prompt, 2, PLAIN).status_code == 200
    ok = post(srv, prompt_of(srv.tok, ceiling - 1), 5, MTP).json()
    assert ok["usage"]["completion_tokens"] == 1  # clamped to the one token left

    # a chat whose prompt falls between the two ceilings, on the SDKs' surfaces
    claude = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    gpt = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    target = (ceiling + CONTEXT) // 2
    words = 1
    messages = [{"role": "user", "content": "a"}]
    while (n := claude.messages.count_tokens(model="m", messages=messages).input_tokens) \
            < target:
        words += target - n
        messages = [{"role": "user", "content": " ".join(["a"] * words)}]
    assert ceiling <= n < CONTEXT
    with pytest.raises(anthropic.BadRequestError) as a_err:
        claude.messages.create(model="m", max_tokens=2, messages=messages, extra_body=MTP)
    assert a_err.value.body["error"]["type"] == "invalid_request_error"
    assert a_err.value.body["error"]["message"].startswith(
        f"prompt is too long: {n} tokens > {ceiling} maximum for a request drafting with "
        "the MTP head (")
    with pytest.raises(openai.BadRequestError) as o_err:
        gpt.chat.completions.create(model="m", max_tokens=2, messages=messages, extra_body=MTP)
    assert o_err.value.code == "context_over_budget"
    plain = gpt.chat.completions.create(model="m", max_tokens=2, messages=messages,
                                        extra_body=PLAIN)
    assert plain.usage.prompt_tokens == n
    assert admission(srv)["mtp_enforced_context_tokens"] == ceiling


def test_an_mtp_requests_broad_max_tokens_is_clamped_to_fit_beside_the_head(srv, ckpt):
    ceiling = mtp_ceiling(srv, ckpt)
    no_eos = {str(i): -100 for i in srv.tok.eos_token_ids}
    first = len(srv.reserved)
    out = complete(srv, prompt_of(srv.tok, 10), 100000, {**MTP, "logit_bias": no_eos})
    assert out["usage"]["completion_tokens"] == ceiling - 10
    assert out["choices"][0]["finish_reason"] == "length"
    ((job, reserved),) = srv.reserved[first:]
    assert job.session.usage.lane == "batched+spec"
    head = srv.engine.predictor.kv_bytes_per_token
    assert reserved == srv.engine.admission.layout.bytes_at(ceiling) + head * ceiling
    assert reserved <= srv.engine.admission.ceiling(mtp=True).kv_room  # it fits alone
