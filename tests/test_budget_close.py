"""The budget-aware close (mlxbun_core/grammar/budget.py) below the server: the close
search on both backends from random mid-reply states, the processor on a real tiny
model's forward pass (cut replies still parse, thinking is cut short to leave room for
the answer), and the session (a call the budget closed is dropped, finish "length")."""

from __future__ import annotations

import json

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

from mlxbun_core.engine.sampling import SamplingParams
from mlxbun_core.engine.session import GenerationRequest, GenerationSession
from mlxbun_core.grammar import GrammarRequest
from mlxbun_core.grammar.budget import CloseSearch
from mlxbun_core.grammar_registry import registry
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import parses_json
from mlxbun_core.toolcalls import JsonDialect, StreamingToolParser

OPEN = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "where": {"type": "object", "properties": {
        "city": {"type": "string", "minLength": 2},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "kind": {"enum": ["flat", "house"]}}, "required": ["city", "zip", "kind"]},
    "age": {"type": "integer", "minimum": 18}, "ok": {"type": "boolean"}},
    "required": ["name", "tags", "where", "age", "ok"]}
SMALL = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "age": {"type": "integer", "minimum": 18}}, "required": ["name", "tags", "age"]}
CASES = {"json_object": (GrammarRequest("json_object"), lambda v: isinstance(v, dict)),
         "schema": (GrammarRequest("json_schema", OPEN), lambda v: jsonschema.validate(v, OPEN)),
         "compact": (GrammarRequest("json_schema", OPEN, "compact"),
                     lambda v: jsonschema.validate(v, OPEN))}
BACKENDS = ["llguidance", "xgrammar"]


@pytest.fixture(scope="module")
def lm():
    return load(str(tiny_checkpoint("qwen3", seed=5)))


def random_prefix(compiled, rng, steps: int):
    """A matcher after up to ``steps`` tokens drawn uniformly among those the grammar
    allows (a random-weight model at its worst), never EOS; and those tokens."""
    m = compiled.new_matcher()
    bits = np.zeros((compiled.vocab_size + 31) // 32, dtype=np.int32)
    ids = []
    for _ in range(steps):
        bits[:] = 0
        m.fill(bits)
        allowed = np.flatnonzero(np.unpackbits(bits.view(np.uint8), bitorder="little"))
        allowed = [int(t) for t in allowed if t < compiled.vocab_size and t not in compiled.eos_ids]
        if not allowed:
            break
        t = allowed[int(rng.integers(len(allowed)))]
        assert m.consume([t])
        ids.append(t)
    return m, ids


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_close_search_ends_json_from_any_state(lm, backend, case):
    """From random states mid-string, mid-number, mid-key, mid-escape: the path found
    ends the grammar, and the whole text parses and validates."""
    _, tok = lm
    req, valid = CASES[case]
    compiled = registry.compile(req, tok, backend)
    search = CloseSearch(compiled.vocab, compiled.vocab_size, compiled.eos_ids)
    rng = np.random.default_rng(0)
    for _ in range(12):
        m, ids = random_prefix(compiled, rng, int(rng.integers(0, 40)))
        path = search.path(m)
        assert path is not None and search.ends(m, path)
        text = tok.decode(ids + path)
        valid(json.loads(text))
        assert len(path) <= len(tok.decode(path).encode())  # never more tokens than bytes


def run_processor(lm, req, budget, seed, *, on=True, prompt="Describe a person:", marker=None):
    """Decode with mlx-lm under the grammar processor; the text of the tokens before EOS."""
    model, tok = lm
    sampler = make_sampler(temp=1.0)
    proc = registry.plan_request(req, tok).processor
    if marker is not None:
        proc.start_after(tok.encode(marker, add_special_tokens=False))
    proc.sampler, proc.close_on_budget = sampler, on
    proc.set_budget(budget)
    mx.random.seed(seed)
    ids = []
    for (t, _), _ in zip(generate_step(mx.array(tok.encode(prompt)), model, sampler=sampler,
                                       logits_processors=[proc]), range(budget)):
        if t in tok.eos_token_ids:
            break
        ids.append(t)
    return tok.decode(ids), proc, len(ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_processor_closes_within_the_limit(lm, backend):
    """Real forward passes at temperature 1: every reply under the budget close parses and
    validates within ``budget`` tokens; where the budget forced the end it says where.
    Switched off, the same requests are cut mid-value."""
    registry.select(backend)
    try:
        req, valid = GrammarRequest("json_schema", SMALL), lambda v: jsonschema.validate(v, SMALL)
        forced, cut_off = 0, 0
        for seed, budget in enumerate((30, 45, 60)):  # the shortest valid reply: ~25 tokens
            text, proc, n = run_processor(lm, req, budget, seed)
            valid(json.loads(text))
            assert n <= budget
            forced += proc.forced_from is not None
            text, proc, _ = run_processor(lm, req, budget, seed, on=False)
            cut_off += not parses_json(text)
            assert proc.forced_from is None
        assert forced and cut_off
    finally:
        registry.chosen = None


def test_thinking_is_cut_short_to_leave_room_for_the_answer(lm):
    """A prompt that opened a think channel the random model never closes: the budget
    forces the end marker in time for the shortest valid answer."""
    _, tok = lm
    for seed, budget in enumerate((30, 50)):
        text, proc, n = run_processor(lm, CASES["json_object"][0], budget, seed, marker="</think>",
                                      prompt="<|im_start|>assistant\n<think>\n")
        thought, sep, answer = text.partition("</think>")
        assert sep and thought and isinstance(json.loads(answer), dict), text
        assert proc.forced_from is not None and n <= budget


class _Closed:
    """A grammar processor's budget report, as the session reads it."""

    def __init__(self, forced_from):
        self.forced_from = forced_from
        self.done = False


def test_session_drops_a_call_the_budget_closed(lm):
    """A call that closed after the budget started forcing has arguments cut short to the
    shortest valid values: not the model's call, never run. The reply says "length"."""
    _, tok = lm
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}}}}]
    one = '<tool_call>{"name": "f", "arguments": {"q": "%s"}}</tool_call>'
    first = tok.encode(one % "whole", add_special_tokens=False)
    ids = first + tok.encode(one % "cu", add_special_tokens=False)
    for forced_from, names in ((None, ["whole", "cu"]), (len(first) + 3, ["whole"])):
        sess = GenerationSession(GenerationRequest(
            prompt_tokens=[1], sampling=SamplingParams(), grammar=_Closed(forced_from),
            tool_parser=StreamingToolParser(JsonDialect(), tools)), tok, None)
        events = [e for t in ids for e in sess.step(t, None)]
        events += sess.step(next(iter(tok.eos_token_ids)), None)
        assert [json.loads(e.call.arguments)["q"] for e in events if e.kind == "tool_call"] == names
        assert sess.finished.reason == ("tool_calls" if forced_from is None else "length")


ITEMS = {"type": "object", "required": ["topics"], "additionalProperties": False,
         "properties": {"topics": {"type": "array", "maxItems": 3, "items": {
             "type": "object", "required": ["title", "summary", "facts", "related"],
             "additionalProperties": False, "properties": {
                 "title": {"type": "string", "minLength": 1, "maxLength": 60},
                 "summary": {"type": "string", "maxLength": 240},
                 "facts": {"type": "array", "maxItems": 4,
                           "items": {"type": "string", "minLength": 1, "maxLength": 160}},
                 "related": {"type": "array", "maxItems": 3,
                             "items": {"type": "string", "minLength": 1, "maxLength": 60}}}}}}}


@pytest.fixture(scope="module")
def lists_eagerly(lm):
    """A logits processor that makes the random model love ``,``, ``"`` and ``{``: it
    ends strings early and opens item after item, the way a model listing things does."""
    _, tok = lm
    bias = np.zeros(lm[0].args.vocab_size, dtype=np.float32)
    for i in range(len(tok.get_vocab())):
        if any(c in tok.decode([i]) for c in ',"{'):
            bias[i] = 4.0
    boost = mx.array(bias)
    return lambda tokens, logits: logits + boost


@pytest.mark.parametrize("temp", [0.0, 1.0])
def test_a_token_that_opens_an_object_of_required_keys_is_guarded(lm, lists_eagerly, temp):
    """One ``,`` or ``{`` in an array of objects commits the reply to a whole object of
    four required keys (~40 tokens of close at once). The budget guards while that jump
    is in sight, so every reply still closes within its limit (before, these budgets cut
    replies a few characters short of the end)."""
    model, tok = lm
    req = GrammarRequest("json_schema", ITEMS)
    for budget in (46, 100, 127):
        proc = registry.plan_request(req, tok).processor
        proc.sampler = sampler = make_sampler(temp=temp)
        proc.set_budget(budget)
        mx.random.seed(budget)
        ids = []
        for (t, _), _ in zip(generate_step(mx.array(tok.encode("Topics:")), model, sampler=sampler,
                                           logits_processors=[lists_eagerly, proc]), range(budget)):
            if t in tok.eos_token_ids:
                break
            ids.append(t)
        jsonschema.validate(json.loads(tok.decode(ids)), ITEMS)
