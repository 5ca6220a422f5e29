"""Structured output end to end: grammar fields on the OpenAI surfaces, both backends,
the degrade path, and grammars forcing each family's tool-call markup through the sampler."""

import importlib
import json
import re

import httpx
import jsonschema
import openai
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure, parses_json
from mlxbun_core.testing.server import start_server

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": False}
MSG = [{"role": "user", "content": "Describe a person."}]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3", seed=5)


OPEN_SCHEMA = {k: v for k, v in SCHEMA.items() if k != "additionalProperties"}  # `llm --schema`


def test_json_schema_default_whitespace_always_valid(client, backend):
    """The hard case from a real client: temperature 1.0, max_tokens 200, no
    any_whitespace, no additionalProperties. Bounded whitespace and closed objects: every
    reply finishes within budget and validates (free whitespace: 7-8 of 10 did)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": OPEN_SCHEMA}}
    for seed in range(10):
        r = client.chat.completions.create(model="m", messages=MSG, response_format=fmt, seed=seed,
                                           temperature=1.0, max_tokens=200)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)  # no extra keys
    chunks = list(client.chat.completions.create(model="m", messages=MSG, response_format=fmt,
                                                 seed=9, temperature=1.0, max_tokens=200,
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_any_whitespace_opt_in_and_compact(client, backend):
    def ask(ws, seed):
        fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA,
                                                      "any_whitespace": ws}}
        return client.chat.completions.create(model="m", messages=MSG, response_format=fmt,
                                              seed=seed, temperature=1.0, max_tokens=200)
    for seed in range(3):
        text = ask(False, seed).choices[0].message.content
        jsonschema.validate(json.loads(text), SCHEMA)
        assert not re.search(r"\s", re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)), text  # compact
    runs = [ask(True, seed) for seed in range(4)]   # unbounded: may not close, valid when it does
    for r in runs:
        if r.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    assert max(len(m.group(0)) for r in runs for m in re.finditer(
        r"\s+", re.sub(r'"(?:[^"\\]|\\.)*"', '""', r.choices[0].message.content))) > 16


def test_json_object_and_structured_outputs(client, backend):
    """Free strings (json_object) on random weights may not close within max_tokens: the
    budget closes them, so every reply validates, finished or cut ("length"). A bounded
    schema (structured_outputs) always finishes on its own."""
    cases = [({"response_format": {"type": "json_object"}}, lambda v: isinstance(v, dict), 0),
             ({"extra_body": {"structured_outputs": SCHEMA}},
              lambda v: jsonschema.validate(v, SCHEMA) or True, 6)]
    for kw, valid, need in cases:
        finished = 0
        for seed in range(6):
            r = client.chat.completions.create(model="m", messages=MSG, temperature=1.0, seed=seed,
                                               max_tokens=200, **kw)
            assert r.choices[0].finish_reason in ("stop", "length")
            finished += r.choices[0].finish_reason == "stop"
            assert valid(json.loads(r.choices[0].message.content))
        assert finished >= need, kw


def test_regex_choice_and_ebnf_on_completions(client, backend):
    for seed in range(3):
        r = client.completions.create(model="m", prompt="Phone:", temperature=1.0, seed=seed,
                                      max_tokens=30, extra_body={"guided_regex": r"\d{3}-\d{4}"})
        assert re.fullmatch(r"\d{3}-\d{4}", r.choices[0].text)
        r = client.completions.create(model="m", prompt="Pick:", temperature=1.0, seed=seed,
                                      max_tokens=30,
                                      extra_body={"guided_choice": ["red", "green", "blue"]})
        assert r.choices[0].text in ("red", "green", "blue")
        grammar = 'root ::= num ("+" num){0,3}\nnum ::= [1-9] [0-9]{0,2}'
        r = client.completions.create(model="m", prompt="Sum:", temperature=1.0, seed=seed,
                                      max_tokens=40, extra_body={"guided_grammar": grammar})
        assert re.fullmatch(r"[1-9][0-9]{0,2}(\+[1-9][0-9]{0,2}){0,3}", r.choices[0].text)


def test_precedence_guided_grammar_beats_response_format(client):
    r = client.chat.completions.create(model="m", messages=MSG, temperature=1.0, seed=1,
                                       max_tokens=20, response_format={"type": "json_object"},
                                       extra_body={"guided_grammar": 'root ::= "yes" | "no"'})
    assert r.choices[0].message.content in ("yes", "no")


def test_text_format_means_no_constraint(srv):
    r = httpx.post(srv.v1 + "/chat/completions", timeout=60, json={
        "messages": MSG, "max_tokens": 3, "response_format": {"type": "text"}})
    assert r.status_code == 200 and "warning" not in r.headers


def test_uncompilable_grammar_degrades_with_warning(srv):
    r = httpx.post(srv.v1 + "/chat/completions", timeout=60, json={
        "messages": MSG, "max_tokens": 3, "guided_grammar": "root ::= ((("})
    assert r.status_code == 200
    assert r.headers["warning"].startswith("grammar not enforced")
    r = httpx.post(srv.v1 + "/completions", timeout=60, json={
        "prompt": "x", "max_tokens": 3, "guided_regex": "(unclosed"})
    assert r.status_code == 200 and r.headers["warning"].startswith("grammar not enforced")


def test_grammar_disabled_by_env(srv, monkeypatch):
    configure(monkeypatch, grammar={"enabled": False})  # what MLXBUN_GRAMMAR=0 sets
    r = httpx.post(srv.v1 + "/chat/completions", timeout=60, json={
        "messages": MSG, "max_tokens": 3, "guided_choice": ["a", "b"]})
    assert r.status_code == 200
    assert "grammar compilation disabled by MLXBUN_GRAMMAR=0" in r.headers["warning"]


# unbounded strings and arrays, nested required keys, a pattern and a minimum: a random
# model at temperature 1 runs out of max_tokens inside a string more often than not
OPEN = {"type": "object", "properties": {
    "name": {"type": "string"}, "notes": {"type": "array", "items": {"type": "string"}},
    "address": {"type": "object", "properties": {
        "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
        "required": ["city", "zip"]},
    "age": {"type": "integer", "minimum": 18}},
    "required": ["name", "notes", "address", "age"]}
CLOSE_CASES = [  # (request fields, validator, budgets: each at least the shortest valid reply)
    ({"response_format": {"type": "json_object"}}, lambda v: isinstance(v, dict), (3, 9, 24)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": OPEN}}},
     lambda v: jsonschema.validate(v, OPEN), (56, 80)),
]


def test_budget_close_alwaysparses_json(client, backend):
    """Tight budgets over many seeds: every constrained reply parses and validates;
    the ones the budget closed say "length", the rest "stop"."""
    for kw, valid, budgets in CLOSE_CASES:
        reasons = []
        for budget in budgets:
            for seed in range(3):
                r = client.chat.completions.create(model="m", messages=MSG, temperature=1.0,
                                                   seed=seed, max_tokens=budget, **kw)
                text, finish = r.choices[0].message.content, r.choices[0].finish_reason
                valid(json.loads(text))
                assert r.usage.completion_tokens <= budget
                reasons.append(finish)
        assert set(reasons) <= {"stop", "length"} and "length" in reasons, reasons
        chunks = list(client.chat.completions.create(model="m", messages=MSG, temperature=1.0,
                                                     seed=7, max_tokens=budgets[1], stream=True,
                                                     **kw))
        valid(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    r = client.completions.create(model="m", prompt="JSON:", temperature=1.0, seed=3, max_tokens=9,
                                  extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(r.choices[0].text), dict)


def test_budget_close_switched_off_leaves_cut_json(client):
    """``budget_close: false``: the same requests get cut inside the JSON again."""
    kw, _, budgets = CLOSE_CASES[1]
    texts = [client.chat.completions.create(
        model="m", messages=MSG, temperature=1.0, seed=seed, max_tokens=budgets[0],
        extra_body={"budget_close": False}, **kw).choices[0].message.content for seed in range(4)]
    assert any(not parses_json(t) for t in texts), texts
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=MSG, max_tokens=5,
                                       extra_body={"budget_close": "no"}, **kw)
    assert e.value.body["param"] == "budget_close"


def test_default_layout_is_the_canonical_one(client, backend):
    """One line, ", " and ": " (what chat templates' tojson writes), no other whitespace."""
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    for seed in range(3):
        reply = client.chat.completions.create(model="m", messages=MSG, response_format=fmt,
                                               seed=seed, temperature=1.0, max_tokens=80)
        text = reply.choices[0].message.content
        def skeleton(s):  # strings out of the way
            return re.sub(r'"(?:[^"\\]|\\.)*"', '""', s)
        assert skeleton(text) == skeleton(json.dumps(json.loads(text))), text


@pytest.mark.parametrize("body", [
    {"response_format": "json"},
    {"response_format": {"type": "xml"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
    {"guided_choice": []},
    {"guided_regex": 5},
])
def test_ill_typed_grammar_fields_are_400(srv, body):
    r = httpx.post(srv.v1 + "/chat/completions", timeout=60, json={"messages": MSG, **body})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_stats_report_backend_and_cache(srv, client):
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
    for _ in range(2):
        client.chat.completions.create(model="m", messages=MSG, response_format=fmt, max_tokens=5)
    g = httpx.get(srv.base_url + "/stats").json()["grammar"]
    assert g["backend"] in g["available"] and g["compile_cache"]["hits"] >= 1


WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}}]

# family: (plugin module, checkpoint model_type, a regex for one call in the family's own markup)
FAMILY_MARKUP = {
    "qwen35": ("mlxbun_qwen35", "qwen3_5",
               r"<tool_call>\n<function=get_weather>\n<parameter=city>\n[A-Z][a-z]{2,8}\n</parameter>\n"
               r"<parameter=days>\n[1-9]\n</parameter>\n</function>\n</tool_call>"),
    "glm52": ("mlxbun_glm52", "glm_moe_dsa",
              r"<tool_call>get_weather<arg_key>city</arg_key><arg_value>[A-Z][a-z]{2,8}</arg_value>"
              r"<arg_key>days</arg_key><arg_value>[1-9]</arg_value></tool_call>"),
    "minicpm5": ("mlxbun_minicpm5", "minicpm5",
                 r'<function name="get_weather"><param name="city">[A-Z][a-z]{2,8}</param>'
                 r'<param name="days">[1-9]</param></function>'),
    "gemma4": ("mlxbun_gemma4", "gemma4_text",
               r'<\|tool_call>call:get_weather\{city:<\|"\|>[A-Z][a-z]{2,8}<\|"\|>,days:[1-9]\}<tool_call\|>'),
}


@pytest.mark.parametrize("family", sorted(FAMILY_MARKUP))
def test_grammar_forces_family_tool_markup_into_tool_calls(family, backend):
    module, model_type, markup = FAMILY_MARKUP[family]
    plugin = importlib.import_module(module)
    ckpt = tiny_checkpoint(model_type, chat_template=plugin.fallback_template())
    s = start_server(ckpt)
    try:
        assert s.engine.model.family == family
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        kw = dict(model="m", messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}],
                  tools=WEATHER, temperature=1.0, seed=4, max_tokens=160,
                  extra_body={"guided_regex": markup,
                              "chat_template_kwargs": {"enable_thinking": False}})
        r = client.chat.completions.create(**kw)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
        call = msg.tool_calls[0]
        args = json.loads(call.function.arguments)
        assert call.function.name == "get_weather" and call.id.startswith("call_")
        assert re.fullmatch(r"[A-Z][a-z]{2,8}", args["city"]) and args["days"] in range(1, 10)
        chunks = list(client.chat.completions.create(stream=True, **kw))
        deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices[0].delta.tool_calls]
        assert deltas[0][0].function.name == "get_weather"
        # the arguments stream in pieces: joined, they are the unstreamed call's
        streamed = "".join(d.function.arguments or "" for ds in deltas for d in ds)
        assert json.loads(streamed) == args
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
    finally:
        s.stop()


THINKING_CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                   "{% endfor %}"
                   "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def test_thinking_model_thinks_freely_then_answers_under_the_grammar(backend):
    """A prompt that opens a think channel: the mask waits for </think>, so the reasoning
    is free text and the constrained answer lands in content."""
    from mlxbun_core import plugins
    from scripted_model import ScriptedPlugin

    plugin = ScriptedPlugin(tiny_checkpoint("qwen3", seed=4243, chat_template=THINKING_CHATML),
                            "Let me weigh it.</think>right",
                            anchor="<|im_start|>assistant\n<think>\n")
    plugins.register(plugin, "scripted-thinking-grammar")
    try:
        s = start_server(plugin.path, batch=1)  # the script follows one sequence
        try:
            client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
            r = client.chat.completions.create(model="m", messages=MSG, max_tokens=40, extra_body={
                "guided_choice": ["left", "right"]})
            msg = r.choices[0].message
            assert msg.content == "right" and r.choices[0].finish_reason == "stop"
            assert msg.model_extra["reasoning"] == "Let me weigh it."
        finally:
            s.stop()
    finally:
        plugins.unregister("scripted-thinking-grammar")
