"""Speculation under a grammar: prompt-lookup drafts are checked against the request's
matcher before they ride (a forbidden token ends the draft), the verify pass masks every
position with the matcher advanced along the draft, and rejected drafts are rolled back
out of the matcher. Greedy replies must equal plain constrained decoding (the same
engine, ``draft_kind: none``) for a JSON schema, a regex and a forced tool call, on the
serial lane and the batch lane (a lone stream, and rows sharing steps)."""

from __future__ import annotations

import json

import pytest

from mlxbun_core.engine.batch import lean
from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.reply import Reply
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure
from tests.test_fill import FIELDS, json_body, run, tool_body

# an earlier record in the prompt: the lookup finds the keys and punctuation there
EXAMPLE = json.dumps({k: (3 if i % 3 == 0 else True if i % 3 == 1 else "red")
                      for i, k in enumerate(FIELDS)})


def with_draft(body: dict, kind: str) -> dict:
    return {**body, "draft_kind": kind}


def regex_body() -> dict:
    ask = "Codes: AB-123-xy AB-123-xy AB-123-xy AB-123-xy. One more code."
    return {"messages": [{"role": "user", "content": ask}], "max_tokens": 60, "temperature": 0,
            "guided_regex": r"(AB-[0-9]{3}-[a-z]{2} ){3,6}"}


def words_body() -> dict:
    """Free words under a regex: the tiny model falls into a loop the lookup predicts."""
    return {"messages": [{"role": "user", "content": "Codes: ab ab ab ab ab"}],
            "max_tokens": 60, "temperature": 0, "guided_regex": r"[a-z ]{20,200}\."}


BODIES = {"json10": json_body(f"Like this one: {EXAMPLE} {EXAMPLE} Give me a record."),
          "regex": regex_body(),
          "words": words_body(),
          "tool": tool_body('Weather in Paris? {"city": "Paris", "unit": "celsius"} '
                            '{"city": "Paris", "unit": "celsius"}')}


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def serial(ckpt):
    eng = Engine.load(str(ckpt), progress=False, batch=1, prompt_cache_bytes=0)
    yield eng
    eng.worker.close()


@pytest.fixture(scope="module")
def batched(ckpt):
    eng = Engine.load(str(ckpt), progress=False, batch=8, prompt_cache_bytes=0)
    yield eng
    eng.worker.close()


def same(a: Reply, b: Reply) -> None:
    """The same reply (the token count may differ by the EOS a speculating stream samples
    where a plain one stops as soon as only EOS may follow)."""
    assert b.content == a.content
    assert [(c.name, c.arguments) for c in b.tool_calls] == \
        [(c.name, c.arguments) for c in a.tool_calls]
    assert b.finish.reason == a.finish.reason
    assert abs(b.finish.usage.completion_tokens - a.finish.usage.completion_tokens) <= 1


def drafted(reply: Reply) -> dict:
    spec = reply.finish.usage.speculation
    assert spec is not None, "the constrained request was not speculated"
    return dict(spec)


@pytest.mark.parametrize("name", list(BODIES))
@pytest.mark.parametrize("lane", ["serial", "solo"])
def test_lookup_under_grammar_equals_plain(serial, batched, lane, name):
    eng = serial if lane == "serial" else batched  # a lone request on --batch 8 runs solo
    body = BODIES[name]
    (plain,), (fast,) = (run(eng, [with_draft(body, "none")], "off"),
                         run(eng, [with_draft(body, "ngram")], "off"))
    assert plain.finish.usage.speculation is None
    same(plain, fast)
    spec = drafted(fast)
    assert spec["drafted"] > 0 and spec["accepted"] > 0
    assert spec["targetCalls"] < fast.finish.usage.completion_tokens  # fewer forwards
    if name == "json10":
        assert set(json.loads(fast.content)) == set(FIELDS)
    if name == "tool":
        assert fast.tool_calls and fast.tool_calls[0].name == "get_weather"


def test_rows_sharing_steps_equal_plain(batched):
    """Several constrained rows (and a plain one) on the batch lane at once."""
    bodies = [*BODIES.values(), {"messages": [{"role": "user", "content": "Hi there"}],
                                 "max_tokens": 30, "temperature": 0}]
    plain = run(batched, [with_draft(b, "none") for b in bodies], "off")
    fast = run(batched, [with_draft(b, "ngram") for b in bodies], "off")
    for a, b in zip(plain, fast):
        same(a, b)
    # the words row ends well before the schema's, so every draft it sent rode a shared
    # step: checked by its grammar, masked per position, the rejected ones rolled back
    words, schema = (fast[list(BODIES).index(k)] for k in ("words", "json10"))
    assert words.finish.usage.completion_tokens < schema.finish.usage.completion_tokens / 2
    spec = drafted(words)
    assert spec["drafted"] > 0 and spec["accepted"] > 0


class Forwards:
    """Counts the model's forward passes: the model's module called, or the lean decode
    step that stands in for it on one-token steps (``batch/lean.py``)."""

    def __init__(self, eng: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        for cls in (type(eng.model.model), lean.LeanDecode):
            self._count(cls, monkeypatch)

    def _count(self, cls: type, monkeypatch: pytest.MonkeyPatch) -> None:
        original = cls.__call__

        def counted(inner, *args, **kwargs):
            self.calls += 1
            return original(inner, *args, **kwargs)
        monkeypatch.setattr(cls, "__call__", counted)

    def run(self, eng: Engine, body: dict, kind: str, fill: str) -> tuple[Reply, int]:
        before = self.calls
        (reply,) = run(eng, [with_draft(body, kind)], fill)
        return reply, self.calls - before


def test_rows_sharing_steps_fill_and_draft(batched, monkeypatch):
    """Batch steps that carry forced runs (a GPU's setting) and grammar rows' drafts
    together: the replies are plain constrained decoding's."""
    configure(monkeypatch, engine={"fill_batch_tokens": 256})
    bodies = [*BODIES.values(), {"messages": [{"role": "user", "content": "Hi there"}],
                                 "max_tokens": 120, "temperature": 0}]
    plain = run(batched, [with_draft(b, "none") for b in bodies], "off")
    both = run(batched, [with_draft(b, "ngram") for b in bodies], "strict")
    for a, b in zip(plain, both):
        same(a, b)
    # the plain row outlasts the words row: its drafts all rode shared steps
    words, chat = both[list(BODIES).index("words")], both[-1]
    assert words.finish.usage.completion_tokens < chat.finish.usage.completion_tokens / 2
    assert drafted(words)["accepted"] > 0
    assert sum(r.finish.usage.fill_report()["injected"] for r in both[:len(BODIES)]) > 0


@pytest.mark.parametrize("name", list(BODIES))
@pytest.mark.parametrize("lane", ["serial", "solo"])
def test_fill_and_drafts_together_equal_plain(serial, batched, lane, name):
    """With fill on and drafts asked for, forced runs are filled and free choices drafted
    in the same windows; the reply is plain constrained decoding's."""
    eng = serial if lane == "serial" else batched
    body = BODIES[name]
    (plain,), (both,) = (run(eng, [with_draft(body, "none")], "off"),
                         run(eng, [with_draft(body, "ngram")], "strict"))
    same(plain, both)
    spec = drafted(both)  # the request ran the guided stream
    assert both.finish.usage.fill_report()["injected"] > 0
    if name == "words":  # free text the lookup predicts: drafts land between the runs
        assert spec["drafted"] > 0 and spec["accepted"] > 0
    if name == "tool":
        assert both.tool_calls and both.tool_calls[0].name == "get_weather"


@pytest.mark.parametrize("name", ["json10", "words"])
@pytest.mark.parametrize("lane", ["serial", "solo"])
def test_fill_and_drafts_take_fewest_forwards(serial, batched, lane, name, monkeypatch):
    """Filling and drafting together runs no more forward passes than either alone (the
    10-field schema, whose free values the tiny model does not copy: as few as fill), and
    fewer than both where the free text repeats (the words)."""
    eng = serial if lane == "serial" else batched
    body, count = BODIES[name], Forwards(eng, monkeypatch)
    plain, n_plain = count.run(eng, body, "none", "off")
    fill, n_fill = count.run(eng, body, "none", "strict")
    ngram, n_ngram = count.run(eng, body, "ngram", "off")
    both, n_both = count.run(eng, body, "ngram", "strict")
    for reply in (fill, ngram, both):
        same(plain, reply)
    assert n_both <= min(n_fill, n_ngram) < n_plain, (n_plain, n_fill, n_ngram, n_both)
    if name == "words":
        assert n_both < min(n_fill, n_ngram), (n_fill, n_ngram, n_both)



@pytest.mark.parametrize(("name", "beside"), [("json10", 3), ("words", 10)])
def test_row_that_fills_and_drafts_goes_on_alone(batched, monkeypatch, name, beside):
    """A constrained row with fill on and drafts asked for shares steps with a plain row
    of ``beside`` tokens (the schema's forced runs ride those steps; the words row's
    drafts do), then is handed back out as the lone stream: the guided stream resumes
    from the row's pending token, handed out (and fed to the grammar) exactly once; the
    reply is plain constrained decoding's."""
    from mlxbun_core.engine.speculate import GuidedStream

    configure(monkeypatch, engine={"fill_batch_tokens": 256})
    resumed: list[dict] = []
    begin = GuidedStream.begin

    def recorded(self, token, emit=None):
        if emit is not None:  # what the row had done in the batch when it left
            usage = self.fill.usage
            resumed.append({**(usage.speculation or {}), **usage.fill_report()})
        return begin(self, token, emit)
    monkeypatch.setattr(GuidedStream, "begin", recorded)
    body = BODIES[name]
    short = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": beside,
             "temperature": 0}
    (plain,) = run(batched, [with_draft(body, "none")], "off")
    both, chat = run(batched, [with_draft(body, "ngram"), with_draft(short, "none")],
                     "strict")
    assert len(resumed) == 1, "the row was not handed back out to the lone stream"
    same(plain, both)
    assert chat.finish.usage.completion_tokens == beside
    left = resumed[0]
    if name == "json10":  # forced runs rode the shared steps
        assert left["injected"] > 0
    else:  # drafts rode them
        assert left["drafted"] > 0
