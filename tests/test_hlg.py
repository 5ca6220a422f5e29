"""HLG tone-curve sampling (``hlg`` request field, ``--hlg-sampling``): the curve's own
properties on a tiny vocabulary, seeded server output against mlx-lm's decode loop with the
curve as its sampler, the degenerate curves that must equal plain sampling, per-row curves
on the batch lane, and the 400 every surface gives a bad curve."""

from __future__ import annotations

import anthropic
import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlxbun_core.engine.hlg import parse_hlg, tone_map, transfer_map
from mlxbun_core.errors import BadRequest
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import run_all, token_ids

PROMPT = "Once upon a time"
N = 16
SEED = 5
SHAPED = {"enabled": True, "width": 0.5, "shoulder": 0.5, "toe": 1.0, "pivot_offset": 1.0}
IDENTITY_POINTS = [[-100, -100], [0, 0]]  # y = x: the model's own log-probs at T = 1
NON_MONOTONE = [[-20, -20], [-10, 0], [0, -5]]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def ref(ckpt):
    return mlx_load(str(ckpt))


# -- the curve itself ------------------------------------------------------------------
TINY = mx.array([[-0.2, -1.9, -2.5, -4.0, -6.0, -9.0, -15.0, -float("inf")]])


def test_tone_curve_keeps_the_ranking_and_the_mask():
    mapped = tone_map(TINY, 1.0, 0.5, 1.0, 2.0, 1.3)
    values = mapped.tolist()[0]
    assert values[-1] == -float("inf")
    assert values[:-1] == sorted(values[:-1], reverse=True)  # monotone: no reordering
    assert len(set(values[:-1])) == 7  # strictly: the rolloffs never flatten a region


def test_tone_curve_changes_the_sampled_distribution_measurably():
    """Seeded draws on an 8-token vocabulary: the shoulder takes mass off the top token
    and gives it to the mids, as the analytic softmax of the curve says."""
    draws = 20000
    mx.random.seed(0)
    plain = mx.random.categorical(mx.broadcast_to(TINY, (draws, 8)))
    mx.random.seed(0)
    curved = mx.random.categorical(mx.broadcast_to(
        tone_map(TINY, 0.5, 0.3, 1.0, 2.0, 1.0), (draws, 8)))
    top_plain = (plain == 0).sum().item() / draws
    top_curved = (curved == 0).sum().item() / draws
    expected = mx.softmax(tone_map(TINY, 0.5, 0.3, 1.0, 2.0, 1.0), axis=-1)[0, 0].item()
    assert top_plain == pytest.approx(mx.softmax(TINY, axis=-1)[0, 0].item(), abs=0.02)
    assert top_curved == pytest.approx(expected, abs=0.02)
    assert top_plain - top_curved > 0.15  # measurably less dominant


def test_wide_mid_is_exactly_temperature():
    """With the mid region covering every log-prob the curve is ``z / T``: the softmax
    equals temperature's."""
    t = 0.7
    mapped = tone_map(TINY, 100.0, 4.0, 6.0, 0.0, 1 / t)
    assert mx.allclose(mx.softmax(mapped, axis=-1), mx.softmax(TINY / t, axis=-1),
                       atol=1e-6).item()


def test_drawn_identity_curve_is_the_identity():
    points = tuple((float(x), float(y)) for x, y in IDENTITY_POINTS)
    assert mx.allclose(transfer_map(TINY[:, :-1], points), TINY[:, :-1], atol=1e-5).item()
    assert transfer_map(TINY, points)[0, -1].item() == -float("inf")


@pytest.mark.parametrize("bad", [
    {"width": -1}, {"toe": 101}, {"shoulder": "wide"}, {"pivot_offset": True},
    {"enabled": "yes"}, {"pivot": "median"}, {"gain": 2}, {"points": NON_MONOTONE},
    {"points": [[-5, 0]]}, {"points": [[-5, 0], [-5, 1]]}, {"points": [[1, 0], [2, 1]]},
    {"points": "up"}, [1, 2],
])
def test_bad_shapes_are_refused(bad):
    with pytest.raises(BadRequest):
        parse_hlg(bad)


def test_request_merges_over_the_server_default():
    server = {"enabled": True, "width": 2.0, "shoulder": 3.0, "toe": 5.0, "pivot_offset": 4.0}
    assert parse_hlg(None, server).width == 2.0
    assert parse_hlg({"toe": 1}, server).toe == 1.0
    assert parse_hlg({"enabled": False}, server) is None
    assert parse_hlg(None, None) is None


# -- over HTTP, seeded, against mlx-lm's decode loop -----------------------------------
def served_ids(srv, **body) -> list[int]:
    body = {"prompt": PROMPT, "max_tokens": N, "seed": SEED, "logprobs": True, **body}
    r = httpx.post(srv.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return [e["id"] for e in r.json()["choices"][0]["logprobs"]["content"]]


def ref_ids(ref, sampler) -> list[int]:
    model, tok = ref
    mx.random.seed(SEED)
    out = []
    for t, _ in generate_step(mx.array(tok.encode(PROMPT)), model, max_tokens=N,
                              sampler=sampler):
        out.append(int(t))
        if t in tok.eos_token_ids:
            break
    return out


def test_seeded_hlg_equals_mlx_lm_with_the_curve(srv, ref):
    t = 0.8
    ours = served_ids(srv, temperature=t, hlg=SHAPED)
    knobs = [SHAPED[k] for k in ("width", "shoulder", "toe", "pivot_offset")]
    curve = lambda lp: mx.random.categorical(tone_map(lp, *knobs, 1 / t))  # noqa: E731
    assert ours == ref_ids(ref, curve)
    assert ours != served_ids(srv, temperature=t)  # the curve changed what was sampled


def test_identity_curve_leaves_the_output_unchanged(srv, ref):
    plain = served_ids(srv, temperature=1.0)
    assert plain == ref_ids(ref, make_sampler(temp=1.0))
    assert served_ids(srv, temperature=1.0, hlg={"points": IDENTITY_POINTS}) == plain
    wide = {"width": 100, "pivot_offset": 0}  # rolloff off: the curve is z = ℓ − max(ℓ)
    assert served_ids(srv, temperature=1.0, hlg=wide) == plain


def test_greedy_is_untouched(srv):
    assert served_ids(srv, temperature=0, hlg=SHAPED) == served_ids(srv, temperature=0)


def test_batch_lane_rows_with_and_without_curves(ckpt):
    """Unseeded rows share the batch lane: a row whose drawn curve is steep enough to be
    argmax samples the greedy tokens, rows without a curve at T = 1 do not."""
    from mlxbun_core.engine.core import Engine

    engine = Engine.load(str(ckpt), progress=False, batch=8, prompt_cache_bytes=0)
    try:
        steep = {"points": [[-10, -100000], [0, 0]]}
        body = {"prompt": PROMPT, "max_tokens": N, "logprobs": True, "temperature": 1.0}
        greedy = token_ids(run_all(engine, [{**body, "temperature": 0}])[0])
        replies = run_all(engine, [{**body, "hlg": steep}, body, {**body, "hlg": steep}, body])
        assert {r.finish.usage.lane for r in replies} == {"batched"}
        ids = [token_ids(r) for r in replies]
        assert ids[0] == greedy and ids[2] == greedy
        assert ids[1] != greedy and ids[3] != greedy
    finally:
        engine.worker.close()


# -- a bad curve is a 400 on every surface, in its own shape ---------------------------
def test_non_monotone_refused_on_chat_and_completions(srv):
    client = openai.OpenAI(base_url=srv.v1, api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model="m", messages=msgs, max_tokens=4,
                                       extra_body={"hlg": {"points": NON_MONOTONE}})
    assert "not monotone" in chat.value.message
    assert chat.value.body["param"] == "hlg.points"
    with pytest.raises(openai.BadRequestError) as comp:
        client.completions.create(model="m", prompt="hi", max_tokens=4,
                                  extra_body={"hlg": {"width": -3}})
    assert "hlg.width" in comp.value.message
    # the server is fine after both
    ok = client.completions.create(model="m", prompt="hi", max_tokens=2,
                                   extra_body={"hlg": SHAPED})
    assert ok.choices[0].text is not None


def test_non_monotone_refused_on_messages(srv):
    client = anthropic.Anthropic(base_url=srv.base_url, api_key="unused", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="m", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}],
                               extra_body={"hlg": {"points": NON_MONOTONE}})
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "invalid_request_error"
    assert "not monotone" in err.value.body["error"]["message"]


# -- --hlg-sampling -------------------------------------------------------------------
def test_server_flags_become_the_default_every_request_merges_over(ckpt):
    from mlxbun_core.cli import build_parser
    from mlxbun_core.engine.core import Engine
    from mlxbun_core.engine.hlg import server_default

    parser = build_parser()
    assert server_default(parser.parse_args(["serve"])) is None
    args = parser.parse_args(["serve", "--hlg-sampling", "on", "--hlg-toe", "2.5"])
    default = server_default(args)
    assert default == {"enabled": True, "width": 4.0, "shoulder": 4.0, "toe": 2.5,
                       "pivot_offset": 6.0}
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--hlg-width", "-1"])
    engine = Engine.load(str(ckpt), progress=False, batch=1, defaults={"hlg": default})
    try:
        assert engine.parse_completion({"prompt": "x"}).sampling.hlg.toe == 2.5
        off = engine.parse_completion({"prompt": "x", "hlg": {"enabled": False}})
        assert off.sampling.hlg is None
    finally:
        engine.worker.close()


def test_responses_reads_hlg_too(srv):
    r = httpx.post(srv.v1 + "/responses", json={"model": "m", "input": "hi",
                                                 "max_output_tokens": 4,
                                                 "hlg": {"points": NON_MONOTONE}}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "hlg.points"
