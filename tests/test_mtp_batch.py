"""MTP speculation on the batch lane: concurrent MTP requests decode together with plain
and prompt-lookup ones in the engine's own batch, each MTP row drafting on the device
from its own hidden states with the tiny Qwen3.5 checkpoint's ``"copy"`` head, all rows
verified in one forward per step, the gated-DeltaNet state put back per row on a
rejection and the kept tokens fed again. Every greedy reply equals the same prompt
decoded alone by mlx-lm (prefix-cache hits included: the prompts repeat); a lone MTP
stream joins the batch mid-reply and the last row leaves it, head and all; a client
walking away mid-stream leaves the others correct; a sampled row runs the same verify;
the block pools (the target's and the heads') are empty afterwards. float32 weights keep
the batched windows off bfloat16 knife-edges.

Without a server, the executor itself (``engine/batch`` with ``MtpBatch`` as its tap)
runs rows that arrive and leave at different times, on a model whose KV only needs a
shorter block table to take drafts back (a tiny llama with a stand-in head) and on the
hybrid one with a random head (rejections, restores and refeeds): tokens equal
mlx-lm's, and each head holds exactly the rows the target's states give it.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
import mlx.core as mx
import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core.engine.speculate import server_config
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure, mlx_lm_greedy, together
from mlxbun_core.testing.mtp import BatchRun, CopyPredictor
from mlxbun_core.testing.server import start_server

PROMPTS = ["hello there how are you", "the sea", "one two three four five six seven",
           "Tell me about the mountains and rivers"]
MTP, PLAIN = {"draft_kind": "mtp"}, {"draft_kind": "none"}
NGRAM = {"draft_kind": "ngram"}
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
    """The batch lane, its MTP draft calls recorded: each decode step's rows (``uids``)
    and how many tokens each MTP row drafted in it. Its block pools are empty when the
    module ends."""
    batch_lane = srv.engine.worker.lanes[0]
    mtp = batch_lane.mtp
    assert mtp is not None
    steps: list[tuple[list[int], dict[int, int]]] = []
    drafts = mtp.drafts

    def recorded(batch):
        out = drafts(batch)
        steps.append((list(batch.decoding), {u: len(d) for u, d in out.items()}))
        return out

    mtp.drafts = recorded
    batch_lane.recorded = steps
    yield batch_lane
    mtp.drafts = drafts
    if srv.engine.prefix is not None:  # finished rows leave their blocks to the prefix cache
        srv.engine.worker.run_sync(srv.engine.prefix.clear)
    assert batch_lane._get_batch().pool.used == 0 and mtp.pages.pool.used == 0


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
    """Decode steps since ``first`` that carried at least ``rows`` rows, MTP drafts among
    them."""
    return sum(len(uids) >= rows and bool(drafted)
               for uids, drafted in lane.recorded[first:])


def test_concurrent_mtp_rows_a_plain_and_a_lookup_one_equal_their_solo_decodes(
        oai, lane, reference, monkeypatch):
    """Rows drafting every step (the landing gate off: the copy head lands too rarely
    here to keep them drafting, and this is about the shared verify)."""
    configure(monkeypatch, speculation={"batch_gate": False})
    first = len(lane.recorded)
    mtp_prompts, plain_prompt, lookup_prompt = PROMPTS[:3], PROMPTS[3], PROMPTS[0]
    out = together(*[lambda p=p: complete(oai, p, MTP) for p in mtp_prompts],
                   lambda: complete(oai, plain_prompt, PLAIN),
                   lambda: complete(oai, lookup_prompt, NGRAM))
    for prompt, r in zip([*mtp_prompts, plain_prompt, lookup_prompt], out, strict=True):
        assert ids_of(r) == reference[prompt], prompt
    assert shared_steps(lane, first, 5) > 0  # all five rows verified in one forward
    for r in out[:3]:
        spec = spec_of(r.usage)
        assert spec is not None and spec["drafted"] > 0
        assert r.usage.model_extra["lane"] == "batched+spec"
    assert sum(spec_of(r.usage)["accepted"] for r in out[:3]) > 0
    assert spec_of(out[3].usage) is None and out[3].usage.model_extra["lane"] == "batched"
    assert out[4].usage.model_extra["lane"] == "batched"  # (prompt lookup: no "+spec")


def streamed(oai, prompt: str, body: dict, started: threading.Event, after: int = 4,
             max_tokens: int = TOKENS) -> tuple[list[int], object]:
    """A greedy streamed completion: its token ids and usage; ``started`` is set once
    ``after`` tokens have arrived."""
    stream = oai.completions.create(model="m", prompt=prompt, max_tokens=max_tokens,
                                    temperature=0, stream=True,
                                    stream_options={"include_usage": True},
                                    extra_body={"logprobs": True, **body})
    ids, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].logprobs:
            ids += [e["id"] for e in chunk.choices[0].logprobs.content]
            if len(ids) >= after:
                started.set()
        usage = chunk.usage or usage
    return ids, usage


def test_a_lone_mtp_request_and_a_deeper_one(oai, lane, reference):
    """A lone MTP request (twice: the second from the first one's cached prefix), then a
    deeper one (``num_draft_tokens: 4``) joining a longer one mid-reply: each row drafts
    its own depth in the same steps."""
    prompt = PROMPTS[2]
    for _turn in range(2):
        alone = complete(oai, prompt, MTP)
        assert ids_of(alone) == reference[prompt]
        assert alone.usage.model_extra["lane"] == "batched+spec"
    assert alone.usage.prompt_tokens_details.cached_tokens > 0
    first, started = len(lane.recorded), threading.Event()

    def deeper():
        assert started.wait(60)
        return complete(oai, prompt, {**MTP, "num_draft_tokens": 4})

    (ids, usage), deep = together(
        lambda: streamed(oai, PROMPTS[0], MTP, started, after=2, max_tokens=4 * TOKENS),
        deeper)
    assert ids[:TOKENS] == reference[PROMPTS[0]] and ids_of(deep) == reference[prompt]
    assert spec_of(deep.usage)["drafted"] > 0 and spec_of(usage)["drafted"] > 0
    # (the head's own depth, 2, for the longer one)
    depths = {n for _, drafted in lane.recorded[first:] for n in drafted.values()}
    assert {2, 4} <= depths and max(depths) == 4


def test_a_lone_mtp_stream_joins_the_batch_mid_reply(srv, oai, lane, reference,
                                                     monkeypatch):
    """A lone MTP request decodes outside the batch (the serial loop's rounds); when two
    more arrive it joins them, its round in flight settled and its head with it: every
    reply is still its own greedy decode. (The landing gates off: the reply's one repeat
    must be drafted whichever step it falls on, cold or not.)"""
    configure(monkeypatch, speculation={"batch_gate": False})
    first = len(lane.recorded)
    started = threading.Event()

    def later(prompt):
        assert started.wait(60)
        return complete(oai, prompt, MTP)

    # (its reply repeats a token twice in a row: a draft lands whichever step drafts it)
    (ids, usage), *rest = together(lambda: streamed(oai, PROMPTS[0], MTP, started),
                                   lambda: later(PROMPTS[1]), lambda: later(PROMPTS[2]))
    assert ids == reference[PROMPTS[0]]
    assert usage.model_extra["lane"] == "batched+spec" and spec_of(usage)["accepted"] > 0
    for prompt, r in zip(PROMPTS[1:3], rest, strict=True):
        assert ids_of(r) == reference[prompt]
    assert shared_steps(lane, first, 3) > 0  # the lone one joined the others


def test_the_last_mtp_row_goes_on_alone(oai, lane, reference, monkeypatch):
    """A batch that drains to one MTP row hands it out to the lone-stream path (its
    pending token, head, pending states and tokens to feed again with it): still its
    own greedy decode."""
    left = []
    leaving = lane.mtp.leaving

    def recorded(uid, refeed):
        state = leaving(uid, refeed)
        left.append(state)
        return state

    monkeypatch.setattr(lane.mtp, "leaving", recorded)
    short, long = together(lambda: complete(oai, PROMPTS[0], MTP, max_tokens=6),
                           lambda: complete(oai, PROMPTS[1], MTP))
    assert ids_of(short) == reference[PROMPTS[0]][:6]
    assert ids_of(long) == reference[PROMPTS[1]]
    assert left and left[0].cache[0].offset > 0  # the long one left with its head's rows
    assert spec_of(long.usage)["drafted"] > 0


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
                                                                            reference,
                                                                            monkeypatch):
    """A plain row with a logits processor shares the MTP step (processed at its one
    position, as mlx-lm's step would); an MTP request with one drafts on the batch lane
    too (its guesses and every verified position processed). The landing gate is off, as
    above: the copy head lands too rarely to keep the rows drafting while they share
    steps (with it on, a CI run saw no shared drafting step)."""
    configure(monkeypatch, speculation={"batch_gate": False})
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
    drafting = complete(oai, PROMPTS[3], {**MTP, **penalty})
    assert ids_of(drafting) == ids_of(alone)
    assert drafting.usage.model_extra["lane"] == "batched+spec"


def test_stats_count_batch_steps(srv):
    stats = httpx.get(srv.base_url + "/stats").json()["speculation"]
    assert stats["batch_steps"] > 0 and stats["accepted"] > 0


# -- the executor and its tap, without a server -------------------------------------------

def arrivals(tok, depths: list[int | None]) -> list[tuple[int, list[int], int, int | None]]:
    """Rows of different prompt lengths and budgets arriving at different steps."""
    prompts = ["Once upon a time there was a", "hi", "one two three four five six seven",
               "the sea the sea the sea", "Tell me about the mountains and rivers"]
    return [(3 * i, tok.encode(prompts[i % len(prompts)]), 24 + 6 * (i % 3), d)
            for i, d in enumerate(depths)]


def assert_equals_mlx_lm(model, run: BatchRun) -> None:
    for i, (_, prompt, budget, _) in enumerate(run.rows):
        assert run.out[i] == mlx_lm_greedy(model, prompt, budget, ()), i
    assert run.batch.pool.used == 0 and run.mtp.pages.pool.used == 0


@pytest.mark.parametrize("depth", [1, 3])
def test_rows_verify_together_on_a_trimmable_cache(depth):
    """MTP rows and plain ones of different prompt lengths, arriving and leaving at
    different times: each row's tokens are its own greedy decode; drafts land and are
    cut back per row; each head read every prompt position before its row's first step
    (the last one's state waits for the token after it)."""
    model, tok = mlx_load(str(tiny_checkpoint("llama", seed=3, dtype="float32")))
    run = BatchRun(model, CopyPredictor(model),
                   arrivals(tok, [depth, None, depth, depth, None])).run()
    assert_equals_mlx_lm(model, run)
    spec = [u.speculation for u in run.usage if u.speculation is not None]
    assert len(spec) == 3 and sum(s["accepted"] for s in spec) > 0
    assert all(s["drafted"] > s["accepted"] for s in spec)
    for i, (_, _, budget, d) in enumerate(run.rows):  # each accepted draft saves a step
        accepted = run.usage[i].speculation["accepted"] if d else 0
        assert run.calls[i] == 1 + budget - accepted, i  # (1: the prompt's last token)
    assert run.read == {i: len(p) - 1 for i, (_, p, _, d) in enumerate(run.rows) if d}


REFEED = pytest.mark.parametrize("refeed", ["1", "4"])  # the CPU's and the GPU's default


@REFEED
def test_rows_roll_back_per_row_on_a_hybrid_model(refeed, monkeypatch):
    """On Qwen3.5 (gated DeltaNet beside attention) with a random head most drafts are
    rejected: the rows' recurrent state is put back per row and their kept tokens fed
    again (alone, or ahead of the next drafts), beside a plain row; every row's tokens
    are still mlx-lm's, and every MTP row's head holds exactly the pairs the target's own
    states give it (the state at ``p`` with the token at ``p + 1``), whatever the
    windows, restores and refeeds."""
    configure(monkeypatch, speculation={"batch_refeed": int(refeed)})
    from mlxbun_core import loader
    from mlxbun_core.model import LoadOptions

    loaded = loader.load(str(tiny_checkpoint("qwen3_5", mtp="random", dtype="float32")),
                         LoadOptions())
    model, predictor = loaded.model, loaded.hooks.token_predictor(model=loaded)
    run = BatchRun(model, predictor, arrivals(loaded.tokenizer, [2, None, 3, 1])).run()
    assert_equals_mlx_lm(model, run)
    spec = [u.speculation for u in run.usage if u.speculation is not None]
    assert sum(s["drafted"] - s["accepted"] for s in spec) > 0  # rollbacks happened
    # a head position costs what admission bills for it
    pages = run.mtp.pages
    assert pages.layout.bytes_per_block() == pages.pool.block_size \
        * predictor.kv_bytes_per_token
    for uid, head in run.ends.items():
        tokens = run.rows[uid][1] + run.out[uid]  # its prompt and every token it gave
        _, hidden = predictor.forward(mx.array([tokens]), model.make_cache())
        want = predictor.make_cache()
        predictor.predict(hidden[:, :-1], mx.array([tokens[1:]]), want)
        rows = head[0].offset
        assert len(run.rows[uid][1]) <= rows < len(tokens), uid
        got, ref = head[0].keys[..., :rows, :], want[0].keys[..., :rows, :]
        assert got.shape == ref.shape and mx.allclose(got, ref, atol=1e-4).item(), uid


@REFEED
def test_host_drafts_take_the_same_rollback_on_a_hybrid_model(refeed, monkeypatch):
    """Prompt lookup's drafts (host lists) ride the same windows on the hybrid model:
    rows get guesses of their own next tokens, some of them wrong, beside rows with
    none; rejected rows get their recurrent state back and feed their kept tokens
    again. Every row's tokens are mlx-lm's and the pool ends empty."""
    import random

    configure(monkeypatch, speculation={"batch_refeed": int(refeed)})
    from mlxbun_core.engine.batch import Batch, BlockPool
    from mlxbun_core.engine.batch.layout import layout

    model, tok = mlx_load(str(tiny_checkpoint("qwen3_5", dtype="float32")))
    rows = arrivals(tok, [None] * 4)
    want = [mlx_lm_greedy(model, p, budget, ()) for _, p, budget, _ in rows]
    rng = random.Random(0)
    batch = Batch(model, layout(model), BlockPool(4, 8, 1 << 20))
    got: list[list[int]] = [[] for _ in rows]
    rejected = 0

    def guesses() -> dict[int, list[int]]:
        out = {}
        for u in batch.decoding:
            if batch.pending(u) is None or u % 2:  # odd rows never draft
                continue
            at = len(got[u]) + 1  # (the pending token is want[u][at - 1])
            d = want[u][at:at + rng.randint(1, 3)]
            if d and rng.random() < 0.5:
                d[rng.randrange(len(d))] ^= 1
            out[u] = d
        return out

    tick = 0
    while any(len(g) < len(w) for g, w in zip(got, want)):
        for i, (at, prompt, budget, _) in enumerate(rows):
            if at == tick:
                batch.add(i, prompt, budget=budget)
        if batch.prefilling:
            batch.prefill({u: 5 for u in batch.prefilling})
        rejected += sum(bool(batch.refeeding(u)) for u in batch.decoding)
        for e in batch.decode(drafts=guesses()):
            got[e.uid].append(e.token)
            if e.finish:
                batch.remove(e.uid)
        tick += 1
    assert got == want
    assert rejected > 0 and batch.pool.used == 0


@REFEED
def test_a_lone_stream_hands_its_head_and_refeed_to_the_batch_and_back(refeed, monkeypatch):
    """The hand-offs of a lone MTP stream (``lanes/solo_mtp.py``), on the hybrid model
    with a random head so that the stream stops right after a rejected round: its KV, its
    head, the states the head has not read and the kept tokens its recurrent layers still
    lack move into a batch row, which decodes on beside another; later the row moves back
    out to a fresh stream the same way. The tokens of all three legs are mlx-lm's."""
    # (the landing gates off: the lone stream's rounds draft, so one is rejected when it
    # hands off)
    configure(monkeypatch, speculation={"batch_refeed": int(refeed), "batch_gate": False})
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.sample_utils import make_sampler
    from mlxbun_qwen35.mtp import load_predictor

    from mlxbun_core.engine.speculate import MtpStream

    path = tiny_checkpoint("qwen3_5", mtp="random", dtype="float32")
    model, tok = mlx_load(str(path))
    predictor = load_predictor(SimpleNamespace(path=path, model=model, config={}, id="t"))
    prompt, other = tok.encode(PROMPTS[2]), tok.encode(PROMPTS[0])
    total = 36
    want = mlx_lm_greedy(model, prompt, total, ())
    greedy = make_sampler(0.0)
    usage = {"drafted": 0, "accepted": 0, "targetCalls": 0}
    stream = MtpStream(predictor, make_prompt_cache(model), [], 2, greedy, [], usage)
    stream.read(prompt[:-1], prompt[-1])
    stream.begin(prompt[-1])
    got: list[int] = []
    while len(got) < 8:
        got += [t for t, _ in stream.step()]
    out, token, head = stream.handoff()
    got += [t for t, _ in out]
    assert head.refeed and head.hidden is not None  # (a rejected round: kept tokens wait)
    assert got[-1] == token and stream.fed + head.refeed == [*prompt, *got[:-1]]

    run = BatchRun(model, predictor, [(0, other, 20, None)])
    batch, mtp = run.batch, run.mtp
    batch.add(1, [token], cache=stream.cache, held=stream.fed, budget=total - len(got),
              tapped=True, refeed=head.refeed)
    mtp.add(1, 2, None, SimpleNamespace(speculation=None), head)
    batch.add(0, other, budget=20)
    while len(got) < 24:
        if batch.prefilling:
            batch.prefill({u: 7 for u in batch.prefilling})
        got += [e.token for e in batch.decode(drafts=mtp.drafts(batch)) if e.uid == 1]
    pending = batch.pending(1)
    assert pending is not None
    back = mtp.leaving(1, batch.refeeding(1))
    cache, fed = batch.export(1)
    batch.close()
    mtp.drop(1)
    assert batch.pool.used == 0 and mtp.pages.pool.used == 0

    again = MtpStream(predictor, cache, fed, 2, greedy, [], usage)
    y, lp = pending
    again.resume(int(y.item()), (int(y.item()), lp), back)
    while len(got) < total:
        got += [t for t, _ in again.step()]
    assert got[:total] == want
    assert usage["drafted"] > usage["accepted"]
    # the head read every state it was handed, in order, across both moves
    tokens = [*prompt, *got]
    _, hidden = predictor.forward(mx.array([tokens]), model.make_cache())
    ref = predictor.make_cache()
    predictor.predict(hidden[:, :-1], mx.array([tokens[1:]]), ref)
    rows = again.head_cache[0].offset
    assert len(prompt) + 24 <= rows < len(tokens)
    assert mx.allclose(again.head_cache[0].keys[..., :rows, :], ref[0].keys[..., :rows, :],
                       atol=1e-4).item()
