"""Structured output: every sampled output must satisfy its constraint, on both
backends, with temperature-1.0 sampling on random weights (the hard case: the model
has no idea what JSON is, so the mask alone has to carry validity)."""

from __future__ import annotations

import json
import os
import re

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from mlxbun_core.errors import BadRequest
from mlxbun_core.grammar import GrammarRequest, describe, resolve_grammar_request
from mlxbun_core.grammar_registry import GrammarRegistry, registry
from mlxbun_core.plugins_builtin import llguidance_backend, xgrammar_backend
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure

BACKENDS = ["llguidance", "xgrammar"]
MODEL_VOCAB = 1088          # > tokenizer's 1024: padded rows must be masked too
SAMPLES = int(os.environ.get("MLXBUN_GRAMMAR_TEST_SAMPLES", 5))


@pytest.fixture(scope="module")
def lm():
    return load(str(tiny_checkpoint("llama", config_overrides={"vocab_size": MODEL_VOCAB})))


@pytest.fixture(scope="module")
def reg():
    r = GrammarRegistry(load_plugins=False)
    llguidance_backend.register_grammar_backends(r.register)
    xgrammar_backend.register_grammar_backends(r.register)
    return r


def sample(lm, reg, backend, req, n=SAMPLES, max_tokens=160, bias=None):
    """``n`` constrained generations; each must finish (grammar complete or EOS)."""
    model, tok = lm
    reg.select(backend)
    prompt = mx.array(tok.encode("Give me an answer:"))
    outs = []
    for seed in range(n):
        mx.random.seed(seed)
        plan = reg.plan_request(req, tok)
        assert plan.processor is not None and plan.warning is None, plan.warning
        procs = make_logits_processors(bias) if bias else []
        ids, finished = [], False
        for (y, _), _i in zip(generate_step(prompt, model, sampler=make_sampler(temp=1.0),
                                            logits_processors=procs + [plan.processor],
                                            max_tokens=max_tokens), range(max_tokens)):
            if y in tok.eos_token_ids:
                finished = True
                break
            ids.append(y)
            if plan.processor.done:
                finished = True
                break
        text = tok.decode(ids)
        assert finished, f"{backend}: grammar not complete after {max_tokens} tokens: {text!r}"
        assert plan.processor.error is None
        outs.append(text)
    return outs


SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "user": {"type": "object",
                     "properties": {"name": {"type": "string", "maxLength": 6},
                                    "admin": {"type": "boolean"}},
                     "required": ["name", "admin"], "additionalProperties": False},
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
        },
        "required": ["user", "id"], "additionalProperties": False,
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]},
                       "size": {"type": "string", "enum": ["S", "M", "L"]},
                       "ok": {"const": True}},
        "required": ["color", "size", "ok"], "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {"scores": {"type": "array", "minItems": 1, "maxItems": 4,
                                  "items": {"type": "integer", "minimum": -5, "maximum": 50}}},
        "required": ["scores"], "additionalProperties": False,
    },
    "anyof_null": {
        "type": "object",
        "properties": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                       {"type": "null"}, {"type": "boolean"}]},
                       "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2}$"}},
        "required": ["v", "code"], "additionalProperties": False,
    },
    "top_array": {"type": "array", "items": {"enum": [1, 2, 3]}, "minItems": 2, "maxItems": 3},
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_always_valid(lm, reg, backend, name):
    schema = SCHEMAS[name]
    for text in sample(lm, reg, backend, GrammarRequest("json_schema", schema, "compact")):
        jsonschema.validate(json.loads(text), schema)
        if name != "nested":                    # no free-text strings: compact separators
            assert " " not in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_json_object(lm, reg, backend):
    _, tok = lm
    # Random weights would write one endless string; a logit_bias toward closing
    # tokens (applied BEFORE the mask, as in the server) makes objects finish.
    bias = {tok.encode(c, add_special_tokens=False)[0]: 6.0 for c in ('"', "}", "]", "1")}
    for text in sample(lm, reg, backend, GrammarRequest("json_object", None, "compact"),
                       max_tokens=300, bias=bias):
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", [r"[A-Z][a-z]{1,6}-[0-9]{2,3}", r"(yes|no|[0-9]{3})!?",
                                     r"\d{2}\.\d{2}"])
def test_regex(lm, reg, backend, pattern):
    for text in sample(lm, reg, backend, GrammarRequest("regex", pattern)):
        assert re.fullmatch(pattern, text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_choice(lm, reg, backend):
    choices = ["yes", "no", "maybe so", 'a "quoted" \\ one', "ünïcode"]
    seen = set()
    for text in sample(lm, reg, backend, GrammarRequest("choice", choices), n=8):
        assert text in choices
        seen.add(text)
    assert len(seen) >= 2


GBNF = r'''
root ::= expr ("," expr)?
expr ::= num op num | "(" num op num ")" op num
op ::= "+" | "-" | "*"
num ::= [1-9] [0-9]?
'''
LARK = r'''
start: "[" item ("," item)? ("," item)? "]"
item: WORD | NUMBER
WORD: /[a-z]{1,4}/
NUMBER: /[0-9]{1,2}/
'''
_NUM = r"[1-9][0-9]?"
_EXPR = rf"(?:{_NUM}[-+*]{_NUM}|\({_NUM}[-+*]{_NUM}\)[-+*]{_NUM})"


@pytest.mark.parametrize("backend", BACKENDS)
def test_ebnf_gbnf_dialect(lm, reg, backend):
    for text in sample(lm, reg, backend, GrammarRequest("ebnf", GBNF)):
        assert re.fullmatch(rf"{_EXPR}(?:,{_EXPR})?", text), text
        for part in text.split(","):
            assert isinstance(eval(part, {}), int)   # really arithmetic


@pytest.mark.parametrize("backend", BACKENDS)
def test_ebnf_lark_dialect(lm, reg, backend):
    for text in sample(lm, reg, backend, GrammarRequest("ebnf", LARK)):
        assert re.fullmatch(r"\[(?:[a-z]{1,4}|[0-9]{1,2})(?:,(?:[a-z]{1,4}|[0-9]{1,2})){0,2}\]",
                            text), text


@pytest.mark.parametrize("backend", BACKENDS)
def test_mask_pads_and_eos(lm, reg, backend):
    """Ids past the tokenizer are masked; EOS only where the grammar accepts; once
    complete, only EOS remains and ``done`` is set."""
    _, tok = lm
    reg.select(backend)
    plan = reg.plan_request(GrammarRequest("choice", ["ab"]), tok, prompt_len=3)
    proc = plan.processor
    logits = mx.zeros((1, MODEL_VOCAB))
    out = np.array(proc(mx.array([5, 6, 7]), logits))[0]
    assert np.isneginf(out[1024:]).all()
    assert all(np.isneginf(out[e]) for e in tok.eos_token_ids)
    assert not proc.done
    ids = tok.encode("ab", add_special_tokens=False)
    out = np.array(proc(mx.array([5, 6, 7] + ids), logits))[0]
    assert proc.done
    assert sorted(np.flatnonzero(~np.isneginf(out))) == sorted(tok.eos_token_ids)


@pytest.mark.parametrize("backend", BACKENDS)
def test_any_whitespace_compiles(lm, reg, backend):
    reg.select(backend)
    plan = reg.plan_request(GrammarRequest("json_schema", SCHEMAS["enums"], "any"), lm[1])
    assert plan.processor is not None


def test_compile_cache_hit(lm, reg):
    _, tok = lm
    reg.select("llguidance")
    body = {"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}}
    same = {"response_format": {"type": "json_schema", "json_schema": {
        "name": "y", "schema": {"properties": {"a": {"type": "integer"}}, "type": "object"}}}}
    h, m = reg.hits, reg.misses
    p1 = reg.plan(body, tok)
    p2 = reg.plan(same, tok)
    assert (reg.hits - h, reg.misses - m) == (1, 1)
    assert p1.processor is not p2.processor            # matchers are per request
    assert p1.processor.compiled is p2.processor.compiled
    assert reg.stats()["compile_cache"]["hits"] == reg.hits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("req", [
    GrammarRequest("ebnf", "root ::= ( \"a\""),
    GrammarRequest("regex", "[a-"),
    GrammarRequest("json_schema", {"type": "object", "properties": {"a": {"$ref": "#/nope"}}}),
], ids=["ebnf", "regex", "schema"])
def test_degrade_on_compile_failure(lm, reg, backend, req):
    reg.select(backend)
    plan = reg.plan_request(req, lm[1])
    assert plan.processor is None
    assert plan.warning.startswith("grammar not enforced: ") and "\n" not in plan.warning
    assert plan.instruction == describe(req)


def test_degrade_when_disabled(lm, reg, monkeypatch):
    configure(monkeypatch, grammar={"enabled": False})  # what MLXBUN_GRAMMAR=0 sets
    plan = reg.plan({"guided_choice": ["a", "b"]}, lm[1])
    assert plan.processor is None
    assert plan.warning == "grammar not enforced: grammar compilation disabled by MLXBUN_GRAMMAR=0"
    assert plan.instruction == ('Respond with exactly one of the following, and nothing else: '
                                '"a", "b"')


def test_no_constraint(lm, reg):
    assert reg.plan({}, lm[1]).processor is None
    plan = reg.plan({"response_format": {"type": "text"}}, lm[1])
    assert (plan.processor, plan.warning, plan.instruction) == (None, None, None)


def test_backend_selection(lm, reg, monkeypatch):
    with pytest.raises(ValueError, match="unknown grammar backend"):
        reg.select("nope")
    r = GrammarRegistry(load_plugins=False)
    llguidance_backend.register_grammar_backends(r.register)
    assert r.selected == "llguidance"
    configure(monkeypatch, grammar={"backend": "missing"})  # MLXBUN_GRAMMAR_BACKEND
    plan = r.plan({"guided_regex": "a+"}, lm[1])
    assert plan.processor is None and "not available" in plan.warning


def test_plugins_register_both_backends():
    """Backends arrive through the pluggy hook like any plugin."""
    assert {"llguidance", "xgrammar"} <= set(GrammarRegistry().available())
    assert registry.selected in registry.available()


# ------------------------------------------------------------ request parsing

def test_describe_texts():
    s = {"type": "object"}
    assert describe(GrammarRequest("json_schema", s)) == \
        'Respond only with JSON matching this schema: {"type": "object"}'
    assert "JSON object" in describe(GrammarRequest("json_object"))
    assert "grammar:\nroot ::= x" in describe(GrammarRequest("ebnf", "root ::= x"))
    assert describe(GrammarRequest("regex", "a+")).endswith(": a+")


RF_SCHEMA = {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}}


@pytest.mark.parametrize("body,kind", [
    ({"guided_grammar": "root ::= \"x\"", "response_format": RF_SCHEMA, "guided_regex": "a"},
     "ebnf"),
    ({"response_format": RF_SCHEMA, "structured_outputs": {"type": "array"}}, "json_schema"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {}, "guided_choice": ["a"]},
     "json_object"),
    ({"structured_outputs": {"type": "array"}, "guided_regex": "a", "guided_choice": ["a"]},
     "json_schema"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "regex"),
    ({"guided_choice": ["a"], "response_format": {"type": "text"}}, "choice"),
    ({"response_format": {"type": "text"}}, None),
    ({"guided_grammar": None, "response_format": None}, None),
])
def test_precedence(body, kind):
    req = resolve_grammar_request(body)
    assert (req.kind if req else None) == kind


def test_request_values():
    req = resolve_grammar_request({"response_format": {"type": "json_schema", "json_schema": {
        "schema": {"type": "array"}, "any_whitespace": False}}})
    assert (req.value, req.whitespace) == ({"type": "array"}, "compact")
    req = resolve_grammar_request({"structured_outputs": {"type": "array"}})
    assert req.value == {"type": "array"}
    assert resolve_grammar_request({"guided_choice": ["x", "y"]}).value == ["x", "y"]


@pytest.mark.parametrize("body,param", [
    ({"response_format": "json"}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "{}"}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"schema": {}, "any_whitespace": 1}}},
     "response_format.json_schema.any_whitespace"),
    ({"guided_grammar": 3}, "guided_grammar"),
    ({"guided_grammar": ""}, "guided_grammar"),
    ({"guided_regex": ["a"]}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_choice": "yes"}, "guided_choice"),
    ({"guided_choice": ["a", 1]}, "guided_choice"),
    ({"structured_outputs": "schema"}, "structured_outputs"),
    # a mistyped lower-precedence field is still an error
    ({"guided_grammar": "root ::= \"x\"", "guided_choice": "yes"}, "guided_choice"),
])
def test_bad_request(body, param):
    with pytest.raises(BadRequest) as ei:
        resolve_grammar_request(body)
    assert ei.value.status == 400 and ei.value.param == param
    with pytest.raises(BadRequest):
        GrammarRegistry(load_plugins=False).plan(body, None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bounded_strings_are_strict_json(lm, reg, backend):
    """Raw control characters are invalid JSON; escapes are valid (xgrammar#800 patch)."""
    _, tok = lm
    reg.select(backend)
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 6}},
              "required": ["a"], "additionalProperties": False}
    compiled = reg.compile(GrammarRequest("json_schema", schema, "compact"), tok)

    def ok(text):
        return compiled.new_matcher().consume(tok.encode(text, add_special_tokens=False))
    assert ok('{"a":"x\\"y"}') and ok('{"a":"abcdef"}')
    assert not ok('{"a":"x\ty"}') and not ok('{"a":"abcdefg"}')


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_lane_per_row_matchers(lm, reg, backend):
    """mlx-lm's BatchGenerator: one processor per row, rows of different prompt
    lengths, EOS seen by the processor after completion must not be an error."""
    from mlx_lm.generate import BatchGenerator

    model, tok = lm
    reg.select(backend)
    mx.random.seed(0)
    pattern = r"[A-Z][a-z]{1,6}-[0-9]{2,3}"
    gen = BatchGenerator(model, max_tokens=40, sampler=make_sampler(temp=1.0),
                         stop_tokens=[[e] for e in tok.eos_token_ids])
    prompts = [tok.encode(p) for p in ("Hi", "Hello there friend", "A", "A longer prompt, ok")]
    procs = [reg.plan_request(GrammarRequest("regex", pattern), tok).processor for _ in prompts]
    uids = gen.insert(prompts, logits_processors=[[p] for p in procs])
    outs, fin = {u: [] for u in uids}, {}
    for _ in range(60):
        for r in gen.next_generated():
            if r.uid not in fin and r.token not in tok.eos_token_ids:
                outs[r.uid].append(r.token)
            if r.finish_reason:
                fin[r.uid] = r.finish_reason
        if len(fin) == len(uids):
            break
    gen.close()
    assert fin == {u: "stop" for u in uids}
    for u, p in zip(uids, procs):
        assert re.fullmatch(pattern, tok.decode(outs[u])) and p.error is None


# ---------------------------------------------------------------- added / special tokens

def test_special_rewriter_regex_choice_lark():
    from mlxbun_core.grammar.llg_special import SpecialRewriter

    rw = SpecialRewriter({"<|tool_call>": 12, "<tool_call|>": 13, '<|"|>': 16})
    pattern = r'<\|tool_call>call:f\{a:<\|"\|>[^<]*<\|"\|>(,b:<\|"\|>\d+<\|"\|>)*\}<tool_call\|>'
    assert rw.regex(pattern) == (
        r'(<[12]> /call:f\{a:/ <[16]> /[^<]*/ <[16]> (/,b:/ <[16]> /[0-9]+/ <[16]>)* /\}/ <[13]>)')
    assert rw.regex(r"a|<\|tool_call>") == "(/a/ | <[12]>)"
    assert rw.regex(r"(x<\|tool_call>)+?y") == "((/x/ <[12]>)+ /y/)"
    for untouched in [r"abc", r"[<|tool_call>]", r"<\|tool_call>?", r"(?i)<\|tool_call>",
                      r"(<\|tool_call>"]:
        assert rw.regex(untouched) is None, untouched
    assert rw.choice(["<|tool_call>x", "y"]) == '(<[12]> "x") | "y"'
    lark = '\n'.join(['start: A "<|\\"|>" b', 'b: /q<\\|tool_call>/ "<tool_call|>"i',
                      'A: "<|tool_call>" B', 'B: /[a-z]+/', '%ignore /[ ]+/', ''])
    assert rw.lark(lark) == '\n'.join([
        'start: llg_special_a (<[16]>) b', 'b: (/q/ <[12]>) "<tool_call|>"i',
        'llg_special_a: (<[12]>) B', 'B: /[a-z]+/', '%ignore /[ ]+/', ''])
    assert rw.lark('start: "plain" /text/') is None


def _walk_agrees(backend, req, prefer, steps=60, seed=0):
    """Walk the grammar: at every step each allowed token must be consumable (mask and
    consume agree); EOS only where the grammar may end; advance on a ``prefer`` token when
    allowed, else a random one.
    Returns the ids taken."""
    cg = backend.compile(req)
    m = cg.new_matcher().m
    rng = np.random.default_rng(seed)
    n = (cg.vocab_size + 31) // 32
    taken = []
    for _ in range(steps):
        bits = np.zeros(n, dtype=np.int32)
        m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
        allowed = [i for i in range(cg.vocab_size) if (int(bits[i // 32]) >> (i % 32)) & 1]
        assert allowed, m.get_error()
        for t in allowed:
            if t in cg.eos_ids:         # never fed to the matcher (GrammarProcessor)
                assert m.is_accepting()
                continue
            c = m.deep_copy()
            assert c.consume_tokens([t]), (t, c.get_error()[:300])
        text = [t for t in allowed if t not in cg.eos_ids]
        if not text:
            break
        pick = next((t for t in prefer if t in text), None)
        t = pick if pick is not None else int(rng.choice(text))
        assert m.consume_tokens([t]), m.get_error()[:300]
        taken.append(t)
    return taken


@pytest.fixture(scope="module")
def family_tokenizers():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return {mt: load_tokenizer(tiny_checkpoint(mt)) for mt in ("qwen3_5", "gemma4_text")}


@pytest.mark.parametrize("req", [
    GrammarRequest("regex", r'<\|tool_call>call:f\{a:<\|"\|>[A-Z][a-z]{1,4}<\|"\|>\}<tool_call\|>'),
    GrammarRequest("choice", ['<|tool_call>call:f{}<tool_call|>', "plain"]),
    GrammarRequest("ebnf",
                   'root ::= call\ncall ::= "<|tool_call>call:" [a-z]{1,4} "{}<tool_call|>"'),
    GrammarRequest("ebnf", 'start: "<|tool_call>" NAME "<tool_call|>"\nNAME: /[a-z]{1,4}/'),
    GrammarRequest("json_schema", {"type": "object", "properties": {
        "m": {"enum": ["<|tool_call>", '<|"|>x']}, "s": {"type": "string", "maxLength": 8}},
        "required": ["m", "s"], "additionalProperties": False}, "compact"),
], ids=["regex", "choice", "gbnf", "lark", "json_schema"])
def test_llguidance_special_tokens_mask_consume_agree(family_tokenizers, req):
    """Gemma 4's ``<|tool_call>`` / ``<|"|>`` are special tokens: spelled in regex,
    choice or EBNF/Lark they are produced by that one token; inside JSON strings they
    are text. Either way every token the mask allows is accepted by consume."""
    tok = family_tokenizers["gemma4_text"]
    backend = llguidance_backend.LLGuidanceBackend(tok)
    specials = [tok.convert_tokens_to_ids(s) for s in ("<|tool_call>", '<|"|>', "<tool_call|>")]
    taken = _walk_agrees(backend, req, prefer=specials)
    text = tok.decode(taken)
    if req.kind == "json_schema":
        assert not set(taken) & set(specials)
        value = json.loads(text)
        assert value["m"] in ("<|tool_call>", '<|"|>x')
    elif req.kind != "choice" or taken[0] == specials[0]:
        assert taken[0] == specials[0] and taken[-1] == specials[2], text
        assert text.startswith("<|tool_call>") and text.endswith("<tool_call|>")


@pytest.mark.parametrize("req", [
    GrammarRequest("regex", r"<tool_call>\n<function=f>\n[a-z]{1,4}\n</function>\n</tool_call>"),
    GrammarRequest("regex", r"<tool_[a-z]+>!"),
    GrammarRequest("ebnf", 'root ::= "<tool_call>" [a-z]{1,4} "</tool_call>"'),
    GrammarRequest("json_schema", {"type": "string", "enum": ["<tool_call>x", "y"]}),
], ids=["regex", "regex_class", "gbnf", "json_schema"])
def test_llguidance_added_tokens_are_text(family_tokenizers, req):
    """Qwen's ``<tool_call>`` is an added token not flagged special: an ordinary text
    token, allowed wherever its text fits (llguidance used to treat it as special and
    then force it for the literal text: a mask / consume mismatch)."""
    tok = family_tokenizers["qwen3_5"]
    backend = llguidance_backend.LLGuidanceBackend(tok)
    tc = tok.convert_tokens_to_ids("<tool_call>")
    taken = _walk_agrees(backend, req, prefer=[tc])
    assert tc in taken, tok.decode(taken)


def test_llguidance_releases_taking_one_eos_still_allow_every_eos(lm, monkeypatch):
    """llguidance < 1.7 accepts a single eos_token; every EOS id must still be allowed
    where the grammar accepts (tokenizers here have several: <|endoftext|>, <|im_end|>...)."""
    import llguidance
    import llguidance.hf

    _, tok = lm
    assert len(tok.eos_token_ids) > 1
    real_tok, real_hf = llguidance.LLTokenizer, llguidance.hf.from_tokenizer

    def one_eos(real):
        def make(*a, eos_token=None, **k):
            if isinstance(eos_token, list):
                raise TypeError("argument 'eos_token': 'list' object cannot be interpreted "
                                "as an integer")
            return real(*a, eos_token=eos_token, **k)
        return make

    monkeypatch.setattr(llguidance, "LLTokenizer", one_eos(real_tok))
    monkeypatch.setattr(llguidance.hf, "from_tokenizer", one_eos(real_hf))
    reg = GrammarRegistry(load_plugins=False)
    llguidance_backend.register_grammar_backends(reg.register)
    reg.select("llguidance")
    proc = reg.plan_request(GrammarRequest("choice", ["ab"]), tok, prompt_len=3).processor
    ids = tok.encode("ab", add_special_tokens=False)
    out = np.array(proc(mx.array([5, 6, 7] + ids), mx.zeros((1, MODEL_VOCAB))))[0]
    assert sorted(np.flatnonzero(~np.isneginf(out))) == sorted(tok.eos_token_ids)
