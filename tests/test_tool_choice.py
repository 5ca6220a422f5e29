"""Forced tool choices end to end: on every chat family's tiny random checkpoint, through
the openai and anthropic SDKs, on both grammar backends, a forced choice always comes
back as parsed calls whose arguments follow the tool's schema. Also: strict tools under
auto, parallel_tool_calls, thinking prompts, and 400s in each surface's own shape."""

from __future__ import annotations

import importlib
import json

import anthropic
import jsonschema
import openai
import pytest

from mlxbun_core.grammar.schema import closed
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from scripted_model import scripted_server

WEATHER = {"name": "get_weather", "description": "Weather forecast for a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 8},
               "days": {"type": "integer", "minimum": 1, "maximum": 9},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "days"]}}
SEARCH = {"name": "search", "description": "Search the web",
          "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 6}},
                         "required": ["q"]}}
TOOLS = [{"type": "function", "function": f} for f in (WEATHER, SEARCH)]
ANTHROPIC_TOOLS = [{"name": f["name"], "description": f["description"],
                    "input_schema": f["parameters"]} for f in (WEATHER, SEARCH)]
SCHEMAS = {f["name"]: closed(f["parameters"]) for f in (WEATHER, SEARCH)}
ASK = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}

# family: (checkpoint model_type, plugin module; None: the generic plugin's JSON dialect)
FAMILIES = {"generic": ("qwen3", None), "qwen35": ("qwen3_5", "mlxbun_qwen35"),
            "glm52": ("glm_moe_dsa", "mlxbun_glm52"), "minicpm5": ("minicpm5", "mlxbun_minicpm5"),
            "gemma4": ("gemma4_text", "mlxbun_gemma4")}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request):
    model_type, module = FAMILIES[request.param]
    if module is None:
        ckpt = tiny_checkpoint(model_type, seed=5)
    else:
        ckpt = tiny_checkpoint(model_type,
                               chat_template=importlib.import_module(module).fallback_template())
    s = start_server(ckpt)
    yield request.param, s
    s.stop()


def valid(name, arguments):
    assert name in SCHEMAS
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])
    return args


def test_forced_calls_through_the_openai_sdk(family, backend):
    name, srv = family
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    # parallel_tool_calls false: a random model would go on calling until max_tokens
    kw = dict(model="m", messages=ASK, tools=TOOLS, temperature=1.0, max_tokens=300,
              parallel_tool_calls=False, extra_body=NO_THINKING)
    for seed in range(3):
        r = client.chat.completions.create(tool_choice="required", seed=seed, **kw)
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content is None, (name, msg)
        (call,) = msg.tool_calls
        valid(call.function.name, call.function.arguments)
    chunks = list(client.chat.completions.create(
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, seed=7,
        stream=True, **kw))
    indices = {d.index for c in chunks for d in c.choices[0].delta.tool_calls or ()}
    ((called, arguments),), _ = streamed_calls(chunks)
    assert called == "get_weather" and indices == {0}
    valid(called, arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ""


def test_forced_calls_through_the_anthropic_sdk(family, backend):
    name, srv = family
    client = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    kw = dict(model="m", max_tokens=300, messages=ASK, tools=ANTHROPIC_TOOLS,
              thinking={"type": "disabled"}, extra_body={"temperature": 1.0})
    r = client.messages.create(tool_choice={"type": "tool", "name": "search",
                                            "disable_parallel_tool_use": True}, **kw)
    assert r.stop_reason == "tool_use", (name, r.content)
    (use,) = [b for b in r.content if b.type == "tool_use"]
    assert use.name == "search" and r.content == [use]
    valid(use.name, use.input)
    with client.messages.stream(tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                **kw) as stream:
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 1
    valid(uses[0].name, uses[0].input)


def test_thinking_prompt_thinks_then_calls():
    """Qwen3.5 thinks by default: the call grammar waits for the end of the think
    channel (a logit bias closes it at once here), then forces the call."""
    from mlxbun_qwen35 import fallback_template

    s = start_server(tiny_checkpoint("qwen3_5", chat_template=fallback_template()))
    try:
        end = s.engine.model.tokenizer.convert_tokens_to_ids("</think>")
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        r = client.chat.completions.create(
            model="m", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=300,
            parallel_tool_calls=False, temperature=1.0, seed=1, logit_bias={str(end): 100})
        msg = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
        assert msg.model_extra.get("reasoning") in (None, "")
        valid(msg.tool_calls[0].function.name, msg.tool_calls[0].function.arguments)
    finally:
        s.stop()


@pytest.fixture(scope="module")
def scripted():
    with scripted_server("Let me check.<tool_call>", name="scripted-tool-choice") as (srv, plugin):
        plugin.free_after = True
        yield srv, plugin


def test_strict_tool_under_auto_gets_schema_exact_arguments(scripted, backend):
    """The (scripted) model chooses to open a call; a random model writes the rest. With
    ``strict`` the grammar takes over at the trigger, so the call parses and validates;
    without it the same continuation is junk."""
    srv, _ = scripted
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    strict = [{"type": "function", "function": dict(f, strict=True)} for f in (WEATHER, SEARCH)]
    kw = dict(model="m", messages=ASK, temperature=1.0, max_tokens=300, parallel_tool_calls=False)
    for seed in range(3):
        r = client.chat.completions.create(tools=strict, seed=seed, **kw)
        msg = r.choices[0].message
        assert msg.content == "Let me check." and r.choices[0].finish_reason == "tool_calls"
        (call,) = msg.tool_calls
        valid(call.function.name, call.function.arguments)
    loose = [client.chat.completions.create(tools=TOOLS, seed=seed, max_tokens=60,
                                            **{k: v for k, v in kw.items() if k != "max_tokens"})
             for seed in range(3)]
    assert not any(r.choices[0].message.tool_calls for r in loose)


def test_unknown_forced_tool_is_a_400_in_each_surface_shape(scripted):
    srv, _ = scripted
    oai = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, tool_choice={
            "type": "function", "function": {"name": "nope"}})
    assert e.value.body["param"] == "tool_choice" and "nope" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="m", messages=ASK, tool_choice="required")
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model="m", input="hi", tools=[dict(WEATHER, type="function")],
                             tool_choice={"type": "function", "name": "nope"})
    assert e.value.body["param"] == "tool_choice" and "nope" in e.value.body["message"]
    ant = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        ant.messages.create(model="m", max_tokens=10, messages=ASK, tools=ANTHROPIC_TOOLS,
                            tool_choice={"type": "tool", "name": "nope"})
    assert e.value.body["type"] == "error" and "nope" in e.value.body["error"]["message"]
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="m", messages=ASK, tools=TOOLS, parallel_tool_calls="no")


def test_responses_forced_function_call():
    """The Responses surface hands tool_choice and parallel_tool_calls to the chat path."""
    s = start_server(tiny_checkpoint("qwen3", seed=5))
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="x", max_retries=0)
        r = client.responses.create(
            model="m", input="Weather in Paris?", temperature=1.0, max_output_tokens=300,
            tools=[dict(WEATHER, type="function", strict=True)], parallel_tool_calls=False,
            tool_choice={"type": "function", "name": "get_weather"})
        calls = [o for o in r.output if o.type == "function_call"]
        assert len(calls) == 1 and calls[0].name == "get_weather"
        valid(calls[0].name, calls[0].arguments)
    finally:
        s.stop()


# -- calls cut by max_tokens (forced choice, parallel calls allowed: a random model goes on
# calling until the budget ends inside a call). Old behaviour: the cut call came back as a
# call with {} or partial arguments, or its markup landed in the text.
CUT_BUDGETS = (40, 70, 110)  # the first call cut, or a later one


def _check_cut(name, finish, calls, text, cut_reason):
    """Every call is whole (its arguments validate), no markup reached the text, and a
    reply that ran out of budget says so."""
    assert finish in ("tool_calls", cut_reason, "length"), (name, finish)
    assert text in (None, ""), (name, text)
    for fn, args in calls:
        valid(fn, args)
    return finish in (cut_reason, "length")


def test_cut_calls_openai_chat(family):
    name, srv = family
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    kw = dict(model="m", messages=ASK, tools=TOOLS, tool_choice="required", temperature=1.0)
    cut = streamed = 0
    for i, budget in enumerate(CUT_BUDGETS):  # without the budget close, then with it
        r = client.chat.completions.create(max_tokens=budget, seed=i, extra_body=dict(
            NO_THINKING, budget_close=False), **kw)
        msg = r.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in msg.tool_calls or ()]
        cut += _check_cut(name, r.choices[0].finish_reason, calls, msg.content, "length")
        chunks = list(client.chat.completions.create(max_tokens=budget, seed=i, stream=True,
                                                     extra_body=NO_THINKING, **kw))
        calls, pieces = streamed_calls(chunks)
        streamed += pieces
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        cut += _check_cut(name, chunks[-1].choices[0].finish_reason, calls, text, "length")
    assert cut, f"{name}: no reply ran out of budget; the cut path was not exercised"
    if name != "gemma4":  # gemma4's dialect has no incremental form: its calls come whole
        assert streamed, f"{name}: no forced call streamed its arguments in pieces"


def streamed_calls(chunks) -> tuple[list[tuple[str, str]], int]:
    """The calls a chat stream made, accumulated by index as clients do, less the ones
    its last chunk withdrew; and how many calls came in more than one argument piece."""
    calls: dict[int, list] = {}
    for c in chunks:
        for d in c.choices[0].delta.tool_calls or () if c.choices else ():
            name, args = calls.setdefault(d.index, [None, []])
            calls[d.index][0] = d.function.name or name
            args.append(d.function.arguments or "")
    withdrawn = (chunks[-1].choices[0].model_extra or {}).get("withdrawn_tool_calls") or []
    kept = [(n, "".join(a)) for i, (n, a) in sorted(calls.items()) if i not in withdrawn]
    return kept, sum(len([p for p in a if p]) > 1 for n, a in calls.values())


def test_cut_calls_anthropic_messages(family):
    name, srv = family
    client = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    kw = dict(model="m", messages=ASK, tools=ANTHROPIC_TOOLS, tool_choice={"type": "any"},
              thinking={"type": "disabled"})
    cut = 0
    for i, budget in enumerate(CUT_BUDGETS[::2]):
        r = client.messages.create(max_tokens=budget, extra_body={
            "temperature": 1.0, "seed": i, "budget_close": False}, **kw)
        text = "".join(b.text for b in r.content if b.type == "text")
        cut += _check_cut(name, r.stop_reason.replace("tool_use", "tool_calls"), [
            (b.name, b.input) for b in r.content if b.type == "tool_use"], text, "max_tokens")
        with client.messages.stream(max_tokens=budget, extra_body={"temperature": 1.0, "seed": i},
                                    **kw) as stream:
            withdrawn = []
            for event in stream:
                if event.type == "message_delta":
                    withdrawn = (event.delta.model_extra or {}).get("withdrawn_tool_use_ids", [])
            final = stream.get_final_message()
        text = "".join(b.text for b in final.content if b.type == "text")
        cut += _check_cut(name, final.stop_reason.replace("tool_use", "tool_calls"), [
            (b.name, b.input) for b in final.content if b.type == "tool_use"
            and b.id not in withdrawn], text, "max_tokens")
    assert cut, f"{name}: no reply ran out of budget"


def test_cut_calls_responses(family):
    name, srv = family
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    kw = dict(model="m", input="Weather in Paris for 3 days?", temperature=1.0,
              tools=[dict(f, type="function") for f in (WEATHER, SEARCH)], tool_choice="required")
    cut = 0
    for i, budget in enumerate(CUT_BUDGETS[::2]):
        r = client.responses.create(max_output_tokens=budget, extra_body=dict(
            NO_THINKING, seed=i, budget_close=False), **kw)
        calls = [(o.name, o.arguments) for o in r.output if o.type == "function_call"]
        finish = "length" if r.status == "incomplete" else "tool_calls"
        cut += _check_cut(name, finish, calls, r.output_text, "length")
        events = list(client.responses.create(max_output_tokens=budget, stream=True,
                                              extra_body=dict(NO_THINKING, seed=i), **kw))
        done = events[-1].response
        calls = [(o.name, o.arguments) for o in done.output if o.type == "function_call"]
        finish = "length" if done.status == "incomplete" else "tool_calls"
        cut += _check_cut(name, finish, calls, done.output_text, "length")
        assert not [e for e in events if e.type == "response.output_text.delta"], name
    assert cut, f"{name}: no reply ran out of budget"


def test_a_named_function_ends_after_its_one_call(family):
    """tool_choice naming one function, parallel calls not turned off: that one call,
    then the reply ends (tool_calls / tool_use / completed) on every surface. It used to
    go on: a random model wrote call after call until max_tokens ended it (length)."""
    name, srv = family
    oai = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    kw = dict(model="m", messages=ASK, tools=TOOLS, temperature=1.0, max_tokens=400,
              extra_body=NO_THINKING,
              tool_choice={"type": "function", "function": {"name": "get_weather"}})
    for seed in range(2):
        r = oai.chat.completions.create(seed=seed, **kw)
        assert r.choices[0].finish_reason == "tool_calls", (name, r.choices[0])
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        valid(call.function.name, call.function.arguments)
    chunks = list(oai.chat.completions.create(seed=2, stream=True, **kw))
    assert chunks[-1].choices[0].finish_reason == "tool_calls", name
    calls, _ = streamed_calls(chunks)
    assert [n for n, _ in calls] == ["get_weather"], name
    valid(*calls[0])
    ant = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    r = ant.messages.create(model="m", max_tokens=400, messages=ASK, tools=ANTHROPIC_TOOLS,
                            thinking={"type": "disabled"}, tool_choice={"type": "tool",
                                                                        "name": "search"},
                            extra_body={"temperature": 1.0, "seed": 3})
    assert r.stop_reason == "tool_use", (name, r.content)
    assert [b.name for b in r.content if b.type == "tool_use"] == ["search"]
    r = oai.responses.create(model="m", input="Weather in Paris?", max_output_tokens=400,
                             temperature=1.0, tools=[dict(WEATHER, type="function")],
                             tool_choice={"type": "function", "name": "get_weather"},
                             extra_body=dict(NO_THINKING, seed=4))
    assert r.status == "completed", (name, r.output)
    assert [o.name for o in r.output if o.type == "function_call"] == ["get_weather"]
