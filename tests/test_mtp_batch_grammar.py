"""MTP drafts for shared batch rows with logits processors: a grammar row's head guesses
are walked under its matcher (masked, a refused one ends the draft), verified with the
grammar at every position of the batch's window and rolled back per row (the gated
DeltaNet state and the matcher) on a rejection; a ``logit_bias`` row's guesses are
processed the same way. Rows arrive staggered (a lone stream joins the batch mid-reply,
the last row leaves it again), and every greedy reply equals plain constrained decoding
(the same engine, ``draft_kind: none``) in fewer target forwards than plain.

The tiny Qwen3.5 checkpoint's head is the ``"copy"`` head (see
:mod:`mlxbun_core.testing.mtp`); its target has recurrent layers.
"""

from __future__ import annotations

import asyncio

import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.reply import Reply, gather
from mlxbun_core.engine.speculate import mtp_batch
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure
from tests.test_mtp_grammar import Forwards, check_shape
from tests.test_spec_grammar import BODIES, drafted, same, with_draft

REFEED = pytest.mark.parametrize("refeed", [1, 4])  # the CPU's and the GPU's default
CHAT = {"messages": [{"role": "user", "content": "Hi there, tell me a story"}],
        "max_tokens": 40, "temperature": 0}


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3_5", mtp="copy", dtype="float32")


@pytest.fixture(scope="module")
def batched(ckpt):
    eng = Engine.load(str(ckpt), progress=False, batch=8, prompt_cache_bytes=0)
    yield eng
    eng.worker.close()


@pytest.fixture
def guided(monkeypatch):
    """The guided MTP walks the batch ran: each one's drafts by row."""
    walks: list[dict[int, list[int]]] = []
    original = mtp_batch.guided_drafts

    def recorded(*args, **kwargs):
        out = original(*args, **kwargs)
        walks.append({u: list(d) for u, d in out.items()})
        return out
    monkeypatch.setattr(mtp_batch, "guided_drafts", recorded)
    return walks


def staggered(eng: Engine, bodies: list[dict], after: int = 3, fill: str = "off"
              ) -> list[Reply]:
    """Start ``bodies`` one by one, each once the one before has streamed ``after``
    events (the first decodes alone, then shares the batch's steps), with fill ``fill``;
    the replies."""
    eng.fill.mode = fill

    async def go():
        tasks, started = [], []
        for body in bodies:
            gen = await eng.start(eng.parse_chat(body))
            seen = asyncio.Event()

            async def collect(gen=gen, seen=seen):
                events = []
                async for ev in gen.events():
                    events.append(ev)
                    if len(events) >= after:
                        seen.set()
                seen.set()
                return gather(events)
            tasks.append(asyncio.create_task(collect()))
            started.append(seen)
            await seen.wait()
        return await asyncio.gather(*tasks)

    return asyncio.run(go())


@REFEED
def test_grammar_rows_draft_in_shared_steps_and_equal_plain(batched, guided, monkeypatch,
                                                            refeed):
    """A 10-field schema, a plain chat row and a free-words row, staggered: replies equal
    plain constrained decoding's; the constrained rows' head drafts rode shared steps
    (walked under their grammars), some accepted; fewer target forwards than plain. The
    landing gate is off: rows draft every step, as this is about the shared walk."""
    configure(monkeypatch, speculation={"batch_refeed": refeed, "batch_gate": False})
    bodies = [BODIES["json10"], CHAT, BODIES["words"]]
    count = Forwards(batched, monkeypatch)
    before = count.calls
    plain = staggered(batched, [with_draft(b, "none") for b in bodies])
    n_plain, before = count.calls - before, count.calls
    fast = staggered(batched, [with_draft(b, "mtp") for b in bodies])
    n_fast = count.calls - before
    for a, b in zip(plain, fast, strict=True):
        same(a, b)
    check_shape("json10", fast[0])
    assert any(len(w) >= 2 for w in guided), "no step walked two grammar rows' drafts"
    schema = drafted(fast[0])
    assert schema["drafted"] > 0 and schema["accepted"] > 0
    assert drafted(fast[2])["drafted"] > 0
    assert n_fast < n_plain, (n_plain, n_fast)


def test_a_tool_call_and_a_regex_row_beside_a_biased_row(batched, guided):
    """A forced tool call and a regex row share steps with a ``logit_bias`` MTP row (its
    guesses processed by the bias, each verified position too): all equal plain."""
    bias = {**CHAT, "logit_bias": {str(t): -100 for t in range(200, 400)}}
    bodies = [BODIES["tool"], bias, BODIES["regex"]]
    plain = staggered(batched, [with_draft(b, "none") for b in bodies])
    fast = staggered(batched, [with_draft(b, "mtp") for b in bodies])
    for a, b in zip(plain, fast, strict=True):
        same(a, b)
    check_shape("tool", fast[0])
    assert drafted(fast[1])["drafted"] > 0
    assert drafted(fast[2])["accepted"] > 0
    rows = {u for w in guided for u in w}
    assert len(rows) >= 2, guided


@pytest.mark.parametrize("step_tokens", [256, 0])
def test_rows_that_fill_and_draft_with_the_head_equal_plain(batched, guided, monkeypatch,
                                                            step_tokens):
    """Under ``--fill strict``: with batch steps carrying forced runs (256, a GPU's
    setting) the schema's forced runs and the rows' head drafts share steps (a draft rides
    where it begins with the step's forced run); with none (the CPU's) the fill sessions
    still consume each row's next token first. Every reply equals plain constrained
    decoding. The landing gate is off (rows draft every step)."""
    configure(monkeypatch, engine={"fill_batch_tokens": step_tokens},
              speculation={"batch_gate": False})
    bodies = [BODIES["json10"], CHAT, BODIES["words"], BODIES["tool"]]
    plain = staggered(batched, [with_draft(b, "none") for b in bodies])
    both = staggered(batched, [with_draft(b, "mtp") for b in bodies], fill="strict")
    for a, b in zip(plain, both, strict=True):
        same(a, b)
    if step_tokens:
        assert sum(r.finish.usage.fill_report()["injected"] for r in both
                   if r.finish.usage.fill) > 0
    assert drafted(both[0])["drafted"] > 0
    assert any(len(w) >= 2 for w in guided)


@REFEED
def test_lookup_drafts_under_a_grammar_ride_shared_steps_of_a_hybrid_model(batched,
                                                                         monkeypatch, refeed):
    """Prompt lookup's drafts for grammar rows sharing steps on a model with recurrent
    layers: a rejected row's state is restored and its kept tokens (which its grammar has
    consumed) fed again, with its next drafts where the refeed cap allows; replies equal
    plain constrained decoding."""
    from mlxbun_core.engine.batch import windows

    configure(monkeypatch, speculation={"batch_refeed": refeed})

    shared: list[int] = []  # drafted grammar rows per window step of several rows
    original = windows._guided

    def recorded(b, rows, plans, drafts, cap):
        out = original(b, rows, plans, drafts, cap)
        if len(rows) > 1:
            shared.append(sum(1 for r, (_, d) in zip(rows, out) if r.processors and len(d)))
        return out
    monkeypatch.setattr(windows, "_guided", recorded)
    bodies = [BODIES["json10"], CHAT, BODIES["words"]]
    plain = staggered(batched, [with_draft(b, "none") for b in bodies])
    fast = staggered(batched, [with_draft(b, "ngram") for b in bodies])
    for a, b in zip(plain, fast, strict=True):
        same(a, b)
    assert any(shared), "no grammar row's lookup drafts rode a shared step"
    assert drafted(fast[0])["accepted"] > 0


@pytest.mark.parametrize("name", ["json10", "tool"])
def test_a_lone_grammar_request_drafts_with_the_head(batched, name, monkeypatch):
    """Alone on a batch engine (the lane's lone stream) a constrained MTP request drafts
    under its grammar as the serial lane does: plain constrained decoding's reply, in
    fewer target forwards."""
    body, count = BODIES[name], Forwards(batched, monkeypatch)
    before = count.calls
    (plain,) = staggered(batched, [with_draft(body, "none")])
    n_plain, before = count.calls - before, count.calls
    (fast,) = staggered(batched, [with_draft(body, "mtp")])
    n_fast = count.calls - before
    same(plain, fast)
    check_shape(name, fast)
    assert fast.finish.usage.lane == "batched+spec"
    assert drafted(fast)["accepted"] > 0
    assert n_fast < n_plain, (n_plain, n_fast)
