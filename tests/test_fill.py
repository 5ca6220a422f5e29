"""Forced-token fill (``MLXBUN_FILL=strict``): the tokens a grammar leaves no choice
about ride along with the sampled token in one forward pass. Greedy replies must equal
step-by-step constrained decoding (the same engine with fill off) on the serial lane,
the batch lane's lone-stream path and the batch lane itself (rows with forced runs and
plain rows in one step), and ``usage.fill`` / ``/stats`` must say what was filled."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.fill import rows as fill_rows
from mlxbun_core.engine.lanes import batch as batch_lane
from mlxbun_core.engine.reply import Reply, gather
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import configure
from mlxbun_core.testing.server import start_server

FIELDS = {f"field_{i}": ({"type": "integer", "minimum": 0, "maximum": 9} if i % 3 == 0 else
                         {"type": "boolean"} if i % 3 == 1 else
                         {"enum": ["red", "green", "blue"]}) for i in range(10)}
SCHEMA = {"type": "object", "properties": FIELDS, "required": list(FIELDS),
          "additionalProperties": False}
WEATHER = {"name": "get_weather", "description": "Weather forecast for a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string", "maxLength": 8},
               "unit": {"enum": ["celsius", "fahrenheit"]}},
               "required": ["city", "unit"]}}


def json_body(ask: str = "Give me a record.", n: int = 160) -> dict:
    return {"messages": [{"role": "user", "content": ask}], "max_tokens": n, "temperature": 0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "record", "schema": SCHEMA}}}


def tool_body(ask: str = "Weather in Paris?") -> dict:
    return {"messages": [{"role": "user", "content": ask}], "max_tokens": 80, "temperature": 0,
            "tools": [{"type": "function", "function": WEATHER}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


def plain_body(ask: str) -> dict:
    return {"messages": [{"role": "user", "content": ask}], "max_tokens": 40, "temperature": 0}


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama", seed=3)


@pytest.fixture(scope="module")
def serial(ckpt):
    eng = Engine.load(str(ckpt), progress=False, batch=1, prompt_cache_bytes=0, fill="strict")
    yield eng
    eng.worker.close()


@pytest.fixture(scope="module")
def batched(ckpt):
    eng = Engine.load(str(ckpt), progress=False, batch=8, prompt_cache_bytes=0, fill="strict")
    yield eng
    eng.worker.close()


def run(eng: Engine, bodies: list[dict], mode: str) -> list[Reply]:
    """Start ``bodies`` together on ``eng`` with fill ``mode``; the replies."""
    eng.fill.mode = mode

    async def go():
        gens = [await eng.start(eng.parse_chat(b)) for b in bodies]

        async def collect(gen):
            return gather([ev async for ev in gen.events()])
        return await asyncio.gather(*[collect(g) for g in gens])

    return asyncio.run(go())


def same(a: Reply, b: Reply) -> None:
    assert b.content == a.content
    assert [(c.name, c.arguments) for c in b.tool_calls] == \
        [(c.name, c.arguments) for c in a.tool_calls]
    assert b.finish.usage.completion_tokens == a.finish.usage.completion_tokens
    assert b.finish.reason == a.finish.reason


def filled(reply: Reply) -> dict:
    """``usage.fill`` of a reply that filled, checked for consistency."""
    assert reply.finish.usage.fill is not None
    fill = reply.finish.usage.fill_report()
    assert fill["injected"] > 0
    assert fill["injected"] == sum(fill["spanLens"]) == fill["strict"]
    assert fill["events"] == len(fill["spanLens"])
    assert fill["injected"] + fill["decodeSteps"] == reply.finish.usage.completion_tokens
    return fill


@pytest.mark.parametrize("body", [json_body(), tool_body()], ids=["json10", "tool"])
@pytest.mark.parametrize("lane", ["serial", "solo"])
def test_fill_equals_step_by_step(serial, batched, lane, body):
    eng = serial if lane == "serial" else batched  # a lone request on --batch 8 runs solo
    (plain,), (fast,) = run(eng, [body], "off"), run(eng, [body], "strict")
    assert plain.finish.usage.fill is None
    same(plain, fast)
    fill = filled(fast)
    assert fill["injected"] > fill["decodeSteps"]  # most of the reply is fixed structure
    if body.get("response_format"):
        assert set(json.loads(fast.content)) == set(FIELDS)
    else:
        assert fast.tool_calls and fast.tool_calls[0].name == "get_weather"


@pytest.mark.parametrize("model_type", ["qwen3_5", "gemma4_text"])
def test_fill_through_recurrent_and_sliding_caches(model_type):
    """A run advances Qwen3.5's recurrent state and Gemma's sliding windows in one forward."""
    eng = Engine.load(str(tiny_checkpoint(model_type, seed=3)), progress=False, batch=8,
                      prompt_cache_bytes=0, fill="strict")
    try:
        (plain,), (fast,) = run(eng, [json_body()], "off"), run(eng, [json_body()], "strict")
    finally:
        eng.worker.close()
    same(plain, fast)
    filled(fast)


def spying(seen: list):
    """The batch lane's ``forcing`` with every step that fed a forced run recorded in
    ``seen`` (how many decoding rows of that step fed none)."""
    real = fill_rows.forcing

    def forcing(fills):
        runs = real(fills)

        def spy(uids, tokens):
            got = runs(uids, tokens)
            if any(got.values()):
                seen.append(sum(1 for u in uids if not got.get(u)))
            return got

        return spy

    return forcing


@pytest.mark.parametrize("step_tokens", ["512", "20"], ids=["gpu-default", "runs-cut"])
def test_batch_rows_with_and_without_runs_share_a_step(batched, monkeypatch, step_tokens):
    # (the CPU's default keeps one token per batch step; 20 = 5 rows x 4: runs cut to 3)
    configure(monkeypatch, engine={"fill_batch_tokens": int(step_tokens)})
    shared = []
    monkeypatch.setattr(batch_lane, "forcing", spying(shared))
    bodies = [json_body(), plain_body("Tell me a story"), tool_body(),
              json_body("Another record, please"), plain_body("Hello there, how are you?")]
    plain, fast = run(batched, bodies, "off"), run(batched, bodies, "strict")
    assert shared and max(shared) > 0, "no batched step mixed forced runs with plain rows"
    for a, b, body in zip(plain, fast, bodies):
        assert b.finish.usage.lane == "batched"
        same(a, b)
        if "tools" in body or "response_format" in body:
            filled(b)
        else:
            assert b.finish.usage.fill is None


def test_cpu_batch_steps_carry_no_runs_by_default(batched, monkeypatch):
    configure(monkeypatch, engine={"fill_batch_tokens": None})
    assert fill_rows.step_tokens() == fill_rows.CPU_STEP_TOKENS == 0
    calls: list = []
    monkeypatch.setattr(batch_lane, "forcing", spying(calls))
    bodies = [json_body(), plain_body("Tell me a story"), tool_body()]
    plain, fast = run(batched, bodies, "off"), run(batched, bodies, "strict")
    assert not calls
    for a, b in zip(plain, fast):
        same(a, b)


def test_sampled_fill_keeps_the_grammar(serial):
    bodies = [{**json_body(), "temperature": 1.0}, {**tool_body(), "temperature": 1.0}]
    reply, call = run(serial, bodies, "strict")
    assert set(json.loads(reply.content)) == set(FIELDS)
    filled(reply)
    args = json.loads(call.tool_calls[0].arguments)
    assert args["unit"] in ("celsius", "fahrenheit")


@pytest.fixture(scope="module")
def srv(ckpt):
    s = start_server(ckpt, batch=4, fill="strict")
    yield s
    s.stop()


def test_usage_fill_on_every_surface(srv):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    body = tool_body()
    out = client.chat.completions.create(model="m", messages=body["messages"],
                                         tools=body["tools"], tool_choice=body["tool_choice"],
                                         max_tokens=80, temperature=0)
    fill = out.usage.model_extra["fill"]
    assert fill["injected"] > 0 and fill["events"] == len(fill["spanLens"])
    stream = client.chat.completions.create(
        model="m", messages=body["messages"], tools=body["tools"],
        tool_choice=body["tool_choice"], max_tokens=80, temperature=0, stream=True,
        stream_options={"include_usage": True})
    last = [c for c in stream if c.usage is not None][-1]
    assert last.usage.model_extra["fill"] == fill

    ant = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    msg = ant.messages.create(model="m", max_tokens=80, messages=body["messages"],
                              tools=[{"name": WEATHER["name"],
                                      "input_schema": WEATHER["parameters"]}],
                              tool_choice={"type": "tool", "name": "get_weather"},
                              extra_body={"temperature": 0})
    assert msg.stop_reason == "tool_use"
    assert msg.usage.model_extra["fill"]["injected"] > 0

    resp = client.responses.create(model="m", input="Give me a record.", temperature=0,
                                   max_output_tokens=160, text={"format": {
                                       "type": "json_schema", "name": "record",
                                       "schema": SCHEMA}})
    assert resp.usage.model_extra["fill"]["injected"] > 0


def test_ineligible_requests_sample_every_token_and_stats_count(srv):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    before = httpx.get(srv.base_url + "/stats").json()["fill"]
    body = json_body(n=40)
    out = client.chat.completions.create(model="m", messages=body["messages"], max_tokens=40,
                                         response_format=body["response_format"], temperature=0,
                                         logprobs=True)
    assert "fill" not in (out.usage.model_extra or {})
    plain = client.chat.completions.create(model="m", messages=body["messages"], max_tokens=8)
    assert "fill" not in (plain.usage.model_extra or {})  # no grammar: nothing to fill
    client.chat.completions.create(model="m", messages=body["messages"], max_tokens=160,
                                   response_format=body["response_format"], temperature=0)
    after = httpx.get(srv.base_url + "/stats").json()["fill"]
    assert after["mode"] == "strict"
    assert after["refused"].get("logprobs", 0) == before["refused"].get("logprobs", 0) + 1
    assert after["requests"] == before["requests"] + 1
    assert after["injected"] > before["injected"] and after["events"] > before["events"]
