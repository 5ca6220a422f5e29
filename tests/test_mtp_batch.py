"""MTP speculation on the batch lane: concurrent MTP requests decode together with plain
ones (continuous batching), each row drafting from its own hidden states with the tiny
Qwen3.5 checkpoint's ``"copy"`` head, all rows verified in one forward per step, the
gated-DeltaNet state put back per row on a rejection. Every greedy reply equals the same
prompt decoded alone by mlx-lm (prefix-cache hits included: the prompts repeat); a lone
MTP stream joins the batch mid-reply; a client walking away mid-stream leaves the others
correct; a sampled row runs the same verify. float32 weights keep the batched windows
off bfloat16 knife-edges. The trimmable path (full attention only, rejected drafts cut
per row) runs on mlx-lm's own BatchGenerator with a tiny llama and a stand-in head.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
from mlx_lm import load as mlx_load
from mlx_lm.generate import BatchGenerator

from mlxbun_core.engine.speculate import mtp_prompt, server_config
from mlxbun_core.engine.speculate.mtp_batch import MtpBatch
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import mlx_lm_greedy, together
from mlxbun_core.testing.mtp import CopyPredictor
from mlxbun_core.testing.server import start_server

PROMPTS = ["hello there how are you", "the sea", "one two three four five six seven",
           "Tell me about the mountains and rivers"]
MTP, PLAIN = {"draft_kind": "mtp"}, {"draft_kind": "none"}
TOKENS = 32


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3_5", mtp="copy", dtype="float32")


@pytest.fixture(scope="module")
def srv(ckpt):
    s = start_server(ckpt, speculation=server_config("mtp"), batch=8)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def lane(srv):
    """The batch lane, its MTP steps recorded: the uids of every step's rows."""
    batch_lane = srv.engine.worker.lanes[0]
    mtp = batch_lane.mtp
    assert mtp is not None
    steps: list[list[int]] = []
    step = mtp.step

    def recorded(batch):
        steps.append(list(batch.uids))
        return step(batch)

    mtp.step = recorded
    batch_lane.recorded = steps
    yield batch_lane
    mtp.step = step


@pytest.fixture(scope="module")
def reference(ckpt):
    """Each prompt's greedy tokens from mlx-lm alone (plain decoding)."""
    model, tok = mlx_load(str(ckpt))
    return {p: mlx_lm_greedy(model, tok.encode(p), TOKENS, tok.eos_token_ids) for p in PROMPTS}


@pytest.fixture(scope="module")
def oai(srv):
    return openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0, timeout=120)


def spec_of(usage) -> dict | None:
    return (usage.model_extra or {}).get("speculation")


def ids_of(r) -> list[int]:
    return [e["id"] for e in r.choices[0].logprobs.content]


def complete(oai, prompt: str, body: dict, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", TOKENS)
    return oai.completions.create(model="m", prompt=prompt,
                                  extra_body={"logprobs": True, **body}, **kw)



def shared_steps(lane, first: int, rows: int) -> int:
    """MTP steps since ``first`` that carried at least ``rows`` rows."""
    return sum(len(uids) >= rows for uids in lane.recorded[first:])


def test_concurrent_mtp_rows_and_a_plain_one_equal_their_solo_decodes(oai, lane, reference):
    first = len(lane.recorded)
    mtp_prompts, plain_prompt = PROMPTS[:3], PROMPTS[3]
    out = together(*[lambda p=p: complete(oai, p, MTP) for p in mtp_prompts],
                   lambda: complete(oai, plain_prompt, PLAIN))
    for prompt, r in zip([*mtp_prompts, plain_prompt], out, strict=True):
        assert ids_of(r) == reference[prompt], prompt
    assert shared_steps(lane, first, 4) > 0  # all four rows verified in one forward
    for r in out[:3]:
        spec = spec_of(r.usage)
        assert spec is not None and spec["drafted"] > 0
        assert r.usage.model_extra["lane"] == "batched+spec"
    assert sum(spec_of(r.usage)["accepted"] for r in out[:3]) > 0
    assert spec_of(out[3].usage) is None and out[3].usage.model_extra["lane"] == "batched"


def test_a_lone_mtp_request_and_a_deeper_one(oai, lane, reference):
    prompt = PROMPTS[2]
    for _turn in range(2):  # the second one starts from the first one's cached prefix
        alone = complete(oai, prompt, MTP)
        assert ids_of(alone) == reference[prompt]
        assert alone.usage.model_extra["lane"] == "batched+spec"
    assert alone.usage.prompt_tokens_details.cached_tokens > 0
    deep, other = together(lambda: complete(oai, prompt, {**MTP, "num_draft_tokens": 4}),
                           lambda: complete(oai, PROMPTS[0], MTP))
    assert ids_of(deep) == reference[prompt] and ids_of(other) == reference[PROMPTS[0]]
    assert spec_of(deep.usage)["drafted"] % 4 == 0 and spec_of(deep.usage)["drafted"] > 0


def test_a_lone_mtp_stream_joins_the_batch_mid_reply(srv, oai, lane, reference):
    """A lone MTP request decodes outside the batch (the serial loop's rounds); when two
    more arrive it joins them, its round in flight settled and its head with it: every
    reply is still its own greedy decode."""
    first = len(lane.recorded)
    started = threading.Event()

    def lone():
        stream = oai.completions.create(model="m", prompt=PROMPTS[2], max_tokens=TOKENS,
                                        temperature=0, stream=True,
                                        stream_options={"include_usage": True},
                                        extra_body={"logprobs": True, **MTP})
        ids, usage = [], None
        for chunk in stream:
            if chunk.choices and chunk.choices[0].logprobs:
                ids += [e["id"] for e in chunk.choices[0].logprobs.content]
                if len(ids) >= 4:
                    started.set()
            usage = chunk.usage or usage
        return ids, usage

    def later(prompt):
        assert started.wait(60)
        return complete(oai, prompt, MTP)

    (ids, usage), *rest = together(lone, lambda: later(PROMPTS[0]), lambda: later(PROMPTS[1]))
    assert ids == reference[PROMPTS[2]]
    assert usage.model_extra["lane"] == "batched+spec" and spec_of(usage)["accepted"] > 0
    for prompt, r in zip(PROMPTS[:2], rest, strict=True):
        assert ids_of(r) == reference[prompt]
    assert shared_steps(lane, first, 3) > 0  # the lone one joined the others


def test_the_last_mtp_row_goes_on_alone(oai, lane, reference, monkeypatch):
    """A batch that drains to one MTP row hands it out to the lone-stream path (its
    pending token, head cache, pending states and refeed with it): still its own greedy
    decode."""
    left = []
    state_of = lane._mtp_state

    def leaving(uid):
        state = state_of(uid)
        left.append(state is not None)
        return state

    monkeypatch.setattr(lane, "_mtp_state", leaving)
    short, long = together(lambda: complete(oai, PROMPTS[0], MTP, max_tokens=6),
                           lambda: complete(oai, PROMPTS[1], MTP))
    assert ids_of(short) == reference[PROMPTS[0]][:6]
    assert ids_of(long) == reference[PROMPTS[1]]
    assert any(left)  # the long one left the batch as an MTP row


def test_a_disconnect_mid_stream_leaves_the_other_rows_correct(srv, oai, lane, reference):
    engine = srv.engine
    done_before = engine.completed
    eos_ban = {str(i): -100 for i in engine.model.tokenizer.eos_token_ids}

    def walk_away():
        with httpx.stream("POST", srv.v1 + "/completions", timeout=60, json={
                "prompt": PROMPTS[3], "max_tokens": 100000, "stream": True, "temperature": 0,
                "logit_bias": eos_ban, **MTP}) as r:
            for i, _line in enumerate(r.iter_lines()):
                if i > 6:
                    break
        return None

    out = together(walk_away, *[lambda p=p: complete(oai, p, MTP) for p in PROMPTS[:3]])
    for prompt, r in zip(PROMPTS[:3], out[1:], strict=True):
        assert ids_of(r) == reference[prompt], prompt
    deadline = time.time() + 20
    # the walked-away row is counted done a moment before its lane lets go of it
    while ((engine.completed < done_before + 4 or engine.worker.active)
           and time.time() < deadline):
        time.sleep(0.05)
    assert engine.completed == done_before + 4 and engine.worker.active == 0
    after = complete(oai, PROMPTS[1], MTP)  # the lane serves on
    assert ids_of(after) == reference[PROMPTS[1]]


def test_a_sampled_row_runs_beside_greedy_ones(oai, lane, reference):
    first = len(lane.recorded)
    sampled, *greedy = together(
        lambda: complete(oai, PROMPTS[0], MTP, temperature=1.0, top_p=0.9),
        *[lambda p=p: complete(oai, p, MTP) for p in PROMPTS[1:3]])
    assert len(ids_of(sampled)) == sampled.usage.completion_tokens
    # unseeded at temperature 1 (a seed would send it to the serial lane): a sampled EOS
    # may end it early, and then only as a stop
    assert (sampled.usage.completion_tokens == TOKENS
            or sampled.choices[0].finish_reason == "stop")
    assert spec_of(sampled.usage)["drafted"] > 0
    assert all(lp["logprob"] <= 0 for lp in sampled.choices[0].logprobs.content)
    for prompt, r in zip(PROMPTS[1:3], greedy, strict=True):
        assert ids_of(r) == reference[prompt]
    assert shared_steps(lane, first, 3) > 0


def test_a_penalized_plain_row_beside_mtp_rows_and_a_penalized_mtp_request(oai, lane,
                                                                            reference):
    """A plain row with a logits processor shares the MTP step (processed at its one
    position, as mlx-lm's step would); an MTP request with one runs on the serial lane,
    where the head's loop processes every verified position."""
    # a logits processor that changes the reply: the plain decode's later tokens banned
    penalty = {"logit_bias": {str(t): -100 for t in reference[PROMPTS[3]][8:]}}
    alone = complete(oai, PROMPTS[3], {**PLAIN, **penalty})
    assert ids_of(alone) != reference[PROMPTS[3]]
    first = len(lane.recorded)
    penalized, *mtp = together(lambda: complete(oai, PROMPTS[3], {**PLAIN, **penalty}),
                               *[lambda p=p: complete(oai, p, MTP) for p in PROMPTS[:2]])
    assert ids_of(penalized) == ids_of(alone)
    for prompt, r in zip(PROMPTS[:2], mtp, strict=True):
        assert ids_of(r) == reference[prompt]
    assert shared_steps(lane, first, 3) > 0
    serial = complete(oai, PROMPTS[3], {**MTP, **penalty})
    assert ids_of(serial) == ids_of(alone) and serial.usage.model_extra["lane"] == "serial+spec"


def test_stats_count_batch_steps(srv):
    stats = httpx.get(srv.base_url + "/stats").json()["speculation"]
    assert stats["batch_steps"] > 0 and stats["accepted"] > 0


@pytest.mark.parametrize("depth", [1, 3])
def test_rows_verify_together_on_a_trimmable_cache(depth):
    """Two MTP rows and a plain one, of different prompt lengths, in mlx-lm's batch:
    each row's tokens are its own greedy decode; drafts land and are cut back per row."""
    model, tok = mlx_load(str(tiny_checkpoint("llama", seed=3, dtype="float32")))
    prompts = [tok.encode(p) for p in ("Once upon a time", "hi", "one two three four five")]
    gen = BatchGenerator(model, completion_batch_size=4, prefill_batch_size=4)
    uids = gen.insert(prompts, max_tokens=[40] * 3)
    mtp = MtpBatch(CopyPredictor(model))
    mtp_prompt.install(gen, mtp)
    usage = [SimpleNamespace(speculation=None) for _ in uids[:2]]
    for uid, u, prompt in zip(uids[:2], usage, prompts[:2], strict=True):
        mtp.add(uid, depth, u, prompt, 0)
    out: dict[int, list[int]] = {uid: [] for uid in uids}
    ended: set[int] = set()
    read_to: dict[int, int] = {}  # prompt positions each head had read at its row's end
    steps = 0
    while len(ended) < len(uids):
        if mtp.wants(gen):
            steps += 1
            with mtp.turn(gen):
                _, responses = gen.next()
        else:
            _, responses = gen.next()
        for r in responses:
            out[r.uid].append(r.token)
            if r.finish_reason is not None:
                ended.add(r.uid)
                if r.uid in mtp.rows:
                    read_to[r.uid] = mtp.rows[r.uid].pos
                mtp.drop(r.uid)
    for uid, prompt in zip(uids, prompts, strict=True):
        assert out[uid] == mlx_lm_greedy(model, prompt, 40, ()), uid
    assert sum(u.speculation["accepted"] for u in usage) > 0
    assert all(u.speculation["drafted"] > u.speculation["accepted"] for u in usage)
    assert steps < 40  # accepted drafts saved steps
    # the heads read every prompt position (the last one with the first step)
    assert read_to == {uid: len(p) - 1 for uid, p in zip(uids[:2], prompts, strict=False)}
    gen.close()
