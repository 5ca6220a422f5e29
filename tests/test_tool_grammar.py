"""Call grammars: every family's dialect writes one call of a tool in its own markup,
arguments following the tool's schema; whatever a worst-case sampler picks under that
grammar parses back into calls whose arguments validate. Both backends; no forward
pass (uniformly random tokens among those the mask allows)."""

from __future__ import annotations

import importlib
import json

import jsonschema
import numpy as np
import pytest

from mlxbun_core.events import Content, ToolCallEvent
from mlxbun_core.grammar import GrammarRequest
from mlxbun_core.grammar import structural as S
from mlxbun_core.grammar.schema import closed
from mlxbun_core.grammar_registry import registry
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.toolcalls import JsonDialect, StreamingToolParser, ToolChoice
from mlxbun_core.toolcalls.constrain import plan_constraint, tool_request
from mlxbun_core.toolcalls.testing import sampled_replies, walk

BACKENDS = ["llguidance", "xgrammar"]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {
        "city": {"type": "string", "maxLength": 10},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "tags": {"type": "array", "items": {"enum": ["rain", "sun"]}, "maxItems": 2},
        "when": {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0,
                                                           "maximum": 23}}}},
    "required": ["city", "days"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "maxLength": 6},
                                     "n": {"type": "integer", "minimum": 1, "maximum": 5}},
    "required": ["q"]}}}
NOARGS = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object",
                                                                          "properties": {}}}}
TOOLS = [WEATHER, SEARCH, NOARGS]
PARAMS = {t["function"]["name"]: closed(t["function"]["parameters"]) for t in TOOLS}

# family: (plugin module or None for the generic JSON dialect, checkpoint model_type)
FAMILIES = {"generic": (None, "llama"), "qwen35": ("mlxbun_qwen35", "qwen3_5"),
            "glm52": ("mlxbun_glm52", "glm_moe_dsa"), "minicpm5": ("mlxbun_minicpm5", "minicpm5"),
            "gemma4": ("mlxbun_gemma4", "gemma4_text")}


@pytest.fixture(scope="module")
def families():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    out = {}
    for fam, (module, model_type) in FAMILIES.items():
        if module is None:
            make = lambda tools: StreamingToolParser(JsonDialect(), tools)  # noqa: E731
        else:
            make = importlib.import_module(module + ".toolcalls").make_parser
        out[fam] = (load_tokenizer(tiny_checkpoint(model_type)), make)
    return out


def check_calls(calls, names):
    assert calls, "no call parsed"
    for c in calls:
        assert c.name in names
        jsonschema.validate(json.loads(c.arguments), PARAMS[c.name])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_forced_calls_parse_and_validate(families, family, backend):
    tok, make = families[family]
    cases = [(ToolChoice("required"), True, {"get_weather", "search", "ping"}),
             (ToolChoice("function", "get_weather"), False, {"get_weather"})]
    for choice, parallel, names in cases:
        req, why = tool_request(make(TOOLS), TOOLS, choice, parallel, None)
        assert why is None and req.kind == "structural"
        for content, calls in sampled_replies(req, tok, backend, lambda: make(TOOLS), range(8)):
            assert content.strip() == "", content
            check_calls(calls, names)
            assert parallel or len(calls) == 1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", ["generic", "qwen35", "gemma4"])
def test_strict_tool_under_auto_constrains_only_opened_calls(families, family, backend):
    """Free text stays free, but the call markup can only be a schema-exact call."""
    tok, make = families[family]
    strict = dict(WEATHER, function=dict(WEATHER["function"], strict=True))
    req, why = tool_request(make([strict]), [strict], ToolChoice("auto"), False, None)
    start = make([strict]).dialect.starts[0]
    compiled = registry.compile(req, tok, backend)
    n_calls = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        ids, finished = walk(compiled, rng, p_stop=0.05)
        text = tok.decode(ids)
        if seed % 3 == 0:   # force a call open: the rest must follow the grammar
            ids2, finished = _open_then_walk(compiled, tok, start, rng)
            text = tok.decode(ids2)
        p = make([strict])
        ev = p.feed(text) + p.finish()
        content = "".join(e.text for e in ev if isinstance(e, Content))
        assert start not in content, text
        calls = [e.call for e in ev if isinstance(e, ToolCallEvent)]
        if calls:
            check_calls(calls, {"get_weather"})
        n_calls += len(calls)
    assert n_calls >= 1


def _open_then_walk(compiled, tok, start, rng):
    m = compiled.new_matcher()
    ids = tok.encode("Sure." + start, add_special_tokens=False)
    assert m.consume(ids), m.error()

    class Resumed:
        vocab_size, eos_ids = compiled.vocab_size, compiled.eos_ids

        @staticmethod
        def new_matcher():
            return m
    more, finished = walk(Resumed, rng, p_stop=0.5)
    return ids + more, finished


@pytest.mark.parametrize("backend", BACKENDS)
def test_response_format_with_tools_allows_content_or_calls(families, backend):
    tok, make = families["qwen35"]
    content = GrammarRequest("json_schema", {"type": "object", "properties": {
        "ok": {"type": "boolean"}}, "required": ["ok"]})
    tools = [dict(t, function=dict(t["function"], strict=True)) for t in TOOLS]
    req, why = tool_request(make(tools), tools, ToolChoice("auto"), True, content)
    kinds = set()
    for text, calls in sampled_replies(req, tok, backend, lambda: make(tools), range(10)):
        if calls:
            kinds.add("calls")
            assert text.strip() == ""
        else:
            kinds.add("json")
            assert json.loads(text) in ({"ok": True}, {"ok": False})
    assert kinds == {"calls", "json"}


def test_without_call_grammar_a_forced_choice_degrades():
    class Plain:
        def feed(self, text):
            return []

    req, why = tool_request(Plain(), TOOLS, ToolChoice("function", "search"), True, None)
    assert "no call grammar" in why and "search" in req.value["describe"]
    req, why = tool_request(Plain(), TOOLS, ToolChoice("auto"), True, None)
    assert (req, why) == (None, None)
    plan = plan_constraint(Plain(), TOOLS, ToolChoice("required"), True, None, None)
    assert plan.processor is None and plan.warning.startswith("grammar not enforced: ")
    assert "get_weather, search, ping" in plan.instruction
    strict = [dict(WEATHER, function=dict(WEATHER["function"], strict=True))]
    plan = plan_constraint(Plain(), strict, ToolChoice("auto"), True, None, None)
    assert plan.warning and not plan.instruction   # a warning, nothing asked in words


@pytest.mark.parametrize("backend", BACKENDS)
def test_structural_formats_accept_and_reject(families, backend):
    tok = families["generic"][0]
    fmt = S.seq(S.const("a:"), S.tag("<v>", S.any_text(4), "</v>"), S.opt(S.const("!")),
                S.json_value({"type": "object", "properties": {"k": {"type": "integer"}},
                              "required": ["k"]}))
    compiled = registry.compile(GrammarRequest("structural", {"format": fmt}), tok, backend)

    def full(text):
        m = compiled.new_matcher()
        if not m.consume(tok.encode(text, add_special_tokens=False)):
            return False
        bits = np.zeros((compiled.vocab_size + 31) // 32, dtype=np.int32)
        m.fill(bits)
        e = compiled.eos_ids[0]
        return bool((int(bits[e // 32]) >> (e % 32)) & 1)
    assert full('a:<v>ab</v>{"k": 1}') and full('a:<v></v>!{"k": 2}')
    assert not full('a:<v>abcde</v>{"k": 1}')          # maxLength 4
    assert not full('a:<v>ab</v>{"k": 1, "x": 2}')     # closed object
    assert not full('a:<v>ab</v>{"k":2}')              # the canonical layout: ": "
    assert not full('a:<v>ab</v>{"k":\n  1}')
