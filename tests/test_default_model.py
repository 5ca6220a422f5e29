"""The embedded default model (SmolLM2-135M-Instruct, converted from its GGUF) gives real
answers."""

import json

import httpx
import openai
import pytest

from mlxbun_core.testing.process import serve

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def srv(smollm2_server):
    return smollm2_server


def test_capital_of_france_non_stream(srv):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    r = client.chat.completions.create(model="default", messages=QUESTION, temperature=0,
                                       max_tokens=16)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


def test_capital_of_france_stream(srv):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="default", messages=QUESTION, temperature=0,
                                                 max_tokens=16, stream=True))
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks)


def test_serve_with_no_model_uses_the_embedded_default(smollm2_path):
    """`mlxbun serve` with no MODEL: the README's run command."""
    env = {"MLXBUN_HOME": str(smollm2_path.parent.parent)}
    with serve(env=env, ready=None) as proc:
        banner = proc.wait_for_line("serving", timeout=120)
        assert "SmolLM2-135M-Instruct" in proc.output and "plugin 'generic'" in banner
        proc.wait_for_http(proc.base + "/health", timeout=30)
        models = httpx.get(proc.base + "/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_forced_tool_call_then_tool_result_round_trip(srv):
    """SmolLM2's template knows no tools: they are described in the system turn, the
    forced call is parsed, and the follow-up turn (assistant tool_calls without content,
    then a tool message) renders instead of failing in the template."""
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    r = client.chat.completions.create(model="default", messages=WEATHER_Q, tools=WEATHER,
                                       tool_choice="required", parallel_tool_calls=False,
                                       temperature=0, max_tokens=40)
    assert r.choices[0].finish_reason == "tool_calls"
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert "Paris" in json.loads(call.function.arguments)["city"]
    r = client.chat.completions.create(model="default", tools=WEATHER, temperature=0, max_tokens=2,
                                       messages=WEATHER_Q + [
        {"role": "assistant", "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny", "celsius": 21}'}])
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
