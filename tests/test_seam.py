"""The typed seam between the surfaces and the engine, without a server.

Every surface module registers as ``register(app: App, engine: Engine)`` and shares state
through the typed ``AppState``; the Anthropic and Responses bodies parse straight into the
engine's ``ChatRequest`` (no OpenAI chat body in between), and that request is the very one
the chat surface builds from the equivalent OpenAI body; errors are born with the field
names the client sent; ``py.typed`` ships, so a plugin author's type checker reads our types.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from pathlib import Path

import pytest
import tomllib

import mlxbun_core
from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.request import ChatRequest, parse_chat
from mlxbun_core.errors import BadRequest
from mlxbun_core.server.anthropic import request as anthropic_request
from mlxbun_core.server.api import SURFACES
from mlxbun_core.server.openai import responses_request
from mlxbun_core.server.state import App, AppState
from mlxbun_core.webapp import ROUTES as WEBAPP_ROUTES

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
DEFAULTS = {"temperature": 0.7, "top_p": 0.95, "repetition_penalty": 1.1}


def test_py_typed_ships_with_the_package():
    assert (Path(mlxbun_core.__file__).parent / "py.typed").is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["mlxbun_core"]


@pytest.mark.parametrize("modname", SURFACES + WEBAPP_ROUTES)
def test_every_surface_registers_through_the_typed_seam(modname):
    module = importlib.import_module(modname)
    hints = typing.get_type_hints(module.register, vars(module),
                                  {"App": App, "Engine": Engine})
    assert hints == {"app": App, "engine": Engine, "return": type(None)}


def test_app_state_fields_are_typed():
    hints = typing.get_type_hints(AppState, vars(importlib.import_module(AppState.__module__)),
                                  {"Engine": Engine})
    assert hints["engine"] is Engine
    assert {f.name for f in dataclasses.fields(AppState)} <= set(hints)
    assert all(h is not typing.Any for h in hints.values())


def same_request(got: ChatRequest, want: ChatRequest) -> None:
    """Equal in every field the engine reads (``surface_state`` is the surface's own)."""
    assert dataclasses.replace(got, surface_state={}) == dataclasses.replace(want, surface_state={})


def test_an_anthropic_body_is_the_chat_request_of_its_openai_twin():
    body = {
        "model": "m", "max_tokens": 32, "system": "Be brief.", "stream": True,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                 "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "And tomorrow?"}]}],
        "temperature": 0.5, "top_k": 20, "seed": 3, "stop_sequences": ["END"],
        "logprobs": True, "max_completion_tokens": 1,  # not Anthropic fields: not read
        "tools": [{"name": "get_weather", "description": "Weather", "input_schema": PARAMS},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "output_config": {"effort": "max", "format": {"type": "json_schema", "schema": SCHEMA}},
        "adapter": "style", "budget_close": False}
    twin = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Checking.", "tool_calls": [{
                "id": "toolu_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
            {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}],
        "max_tokens": 32, "stream": True, "temperature": 0.5, "top_k": 20, "seed": 3,
        "stop": ["END"],
        "tools": [{"type": "function", "function": {"name": "get_weather",
                                                    "description": "Weather",
                                                    "parameters": PARAMS}}],
        "tool_choice": "required", "parallel_tool_calls": False,
        "chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "xhigh",
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "output", "schema": SCHEMA}},
        "adapter": "style", "budget_close": False}
    got = anthropic_request.parse_request(body, DEFAULTS, 64)
    same_request(got, parse_chat(twin, DEFAULTS, 64))
    assert got.sampling.repetition_penalty == 1.1 and got.sampling.temperature == 0.5
    assert not got.sampling.logprobs and got.max_tokens == 32


def test_a_responses_body_is_the_chat_request_of_its_openai_twin():
    stored = {"system": "Earlier rules.", "messages": [{"role": "user", "content": "Hi"},
                                                       {"role": "assistant", "content": "Hello"}]}
    body = {
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 16, "stream": False,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Paris"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "reasoning", "summary": []}],
        "temperature": 0.5, "logit_bias": {"5": 1.0}, "stop": ["END"], "top_logprobs": 3,
        "tools": [{"type": "function", "name": "get_weather", "parameters": PARAMS},
                  {"type": "web_search"}],
        "tool_choice": "required", "parallel_tool_calls": False,
        "text": {"format": {"type": "json_schema", "name": "o", "schema": SCHEMA}},
        "reasoning": {"effort": "low"}}
    twin = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "max_tokens": 16, "stream": False, "temperature": 0.5, "logit_bias": {"5": 1.0},
        "stop": ["END"],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "",
                                                    "strict": True, "parameters": PARAMS}}],
        "tool_choice": "required", "parallel_tool_calls": False, "reasoning_effort": "low",
        "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": SCHEMA}}}
    got = responses_request.parse_request(body, stored, DEFAULTS, 64)
    same_request(got, parse_chat(twin, DEFAULTS, 64))
    assert got.sampling.top_logprobs == -1  # not a Responses field: not read
    assert got.surface_state["system"] == "Be brief."
    assert got.surface_state["convo"] == twin["messages"][1:]


@pytest.mark.parametrize("body,message,param", [
    ({"max_tokens": 0}, "max_tokens must be at least 1", "max_tokens"),
    ({"stop_sequences": [1]}, "stop_sequences must be a string or a list of strings",
     "stop_sequences"),
    ({"output_config": {"format": {"type": "json_schema", "schema": 5}}},
     "output_config.format.schema must be a JSON schema object", "output_config.format.schema"),
    ({"output_format": {"type": "json_schema"}},
     "output_format.schema must be a JSON schema object", "output_format.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}},
     "response_format.json_schema.schema must be a JSON schema object",
     "response_format.json_schema.schema"),
    ({"output_config": {"effort": "huge"}}, "output_config.effort must be one of",
     "output_config.effort"),
    ({"reasoning_effort": "huge", "output_config": {"effort": "high"}},
     "reasoning_effort must be one of", "reasoning_effort"),
    ({"messages": [{"role": "user", "content": "hi"},
                   {"role": "system", "content": "x", "output_config": {"effort": "huge"}}]},
     "messages[1].output_config.effort must be one of", "messages[1].output_config.effort"),
    ({"temperature": "hot"}, "temperature must be of type ('float', 'int')",
     "temperature"),
])
def test_anthropic_errors_are_born_with_anthropic_names(body, message, param):
    with pytest.raises(BadRequest) as err:
        anthropic_request.parse_request({"max_tokens": 8,
                                         "messages": [{"role": "user", "content": "hi"}], **body})
    assert err.value.message.startswith(message) and err.value.param == param


@pytest.mark.parametrize("body,message,param", [
    ({"max_output_tokens": "x"}, "max_output_tokens must be of type int", "max_output_tokens"),
    ({"max_tokens": 0}, "max_tokens must be at least 1", "max_tokens"),
    ({"text": {"format": {"type": "json_schema", "schema": []}}},
     "text.format.schema must be a JSON schema object", "text.format.schema"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort must be one of", "reasoning.effort"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "input_audio part needs base64 data", "input"),
    ({"stop": 5}, "stop must be a string or a list of strings", "stop"),
])
def test_responses_errors_are_born_with_responses_names(body, message, param):
    with pytest.raises(BadRequest) as err:
        responses_request.parse_request({"input": "hi", **body})
    assert err.value.message.startswith(message) and err.value.param == param
