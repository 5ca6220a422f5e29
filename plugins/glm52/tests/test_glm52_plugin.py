"""mlxbun-glm52 end to end: claim, chat template behaviour, served chat, greedy parity.

A tiny random ``glm_moe_dsa`` checkpoint (real config schema and special tokens, float32
MoE) behind a real HTTP server, driven by the openai SDK. Random weights: only structure
and parity are asserted, never text.
"""

import json

import mlxbun_glm52
import pytest

from mlxbun_core import loader
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.conformance import ReasoningFamilyChecks
from mlxbun_core.testing.engine import rendered_chat
from mlxbun_core.toolcalls import StreamingToolParser

MSG = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"},
        "opts": {"type": "object"}}, "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {
    "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3,
                                                    "opts": {"unit": "C"}})}}


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("glm_moe_dsa", seed=5, chat_template=mlxbun_glm52.fallback_template())


def render(srv, messages=MSG, **body):
    """The prompt the engine would run for a chat body (normalization included)."""
    return rendered_chat(srv.engine, {"messages": messages, **body})


# ---------------------------------------------------------------- claim

def test_claims_only_glm5_configs():
    assert mlxbun_glm52.claims({"model_type": "glm_moe_dsa"})
    assert mlxbun_glm52.claims({"model_type": "x", "architectures": ["GlmMoeDsaForCausalLM"]})
    assert not mlxbun_glm52.claims({"model_type": "glm4_moe",
                                    "architectures": ["Glm4MoeForCausalLM"]})
    assert not mlxbun_glm52.claims({"model_type": "llama"})


def test_generation_config_wins_over_family_defaults():
    tuned = tiny_checkpoint("glm_moe_dsa", seed=5, chat_template=mlxbun_glm52.fallback_template(),
                            generation_config={"temperature": 0.6})
    m = loader.claim(tuned, LoadOptions(model_id="tuned"))
    assert m.extras["fallback_template"] is False  # the checkpoint ships one
    assert m.generation_defaults["temperature"] == 0.6  # the checkpoint's value
    assert m.generation_defaults["top_p"] == 0.95  # the family default fills the gap


# ---------------------------------------------------------------- template

def test_default_is_no_think_with_empty_think_primer(srv):
    text, req = render(srv)
    assert text == "[gMASK]<sop><|user|>What is the capital of France?<|assistant|><think></think>"
    assert "Reasoning Effort" not in text and req.in_reasoning is False
    assert (req.think_start, req.think_end) == ("<think>", "</think>")


def test_enable_thinking_adds_effort_line_and_open_primer(srv):
    text, req = render(srv, chat_template_kwargs={"enable_thinking": True})
    assert text == ("[gMASK]<sop><|system|>Reasoning Effort: Max<|user|>"
                    "What is the capital of France?<|assistant|><think>")
    assert req.in_reasoning is True


def test_tools_and_tool_history_render_natively(srv):
    msgs = [{"role": "system", "content": "Be brief."}, *MSG,
            {"role": "assistant", "content": None, "reasoning": "I should look it up.",
             "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_2", "content": "windy"}]
    text, _ = render(srv, msgs, tools=TOOLS)
    sys_turn = text.split("<|system|>")[1]
    assert sys_turn.startswith("# Tools") and '"name": "get_weather"' in sys_turn
    assert "<|system|>Be brief.<|user|>" in text
    # the `reasoning` alias reaches the template as reasoning_content (a tool-loop turn)
    assert ("<|assistant|><think>I should look it up.</think><tool_call>get_weather"
            "<arg_key>city</arg_key><arg_value>Paris</arg_value>"
            "<arg_key>days</arg_key><arg_value>3</arg_value>"
            '<arg_key>opts</arg_key><arg_value>{"unit": "C"}</arg_value></tool_call>') in text
    assert text.endswith("<|observation|><tool_response>sunny</tool_response>"
                         "<tool_response>windy</tool_response><|assistant|><think></think>")
    # thinking on with tools: the effort line leads the same system turn
    text, _ = render(srv, msgs, tools=TOOLS, reasoning_effort="low")
    assert text.split("<|system|>")[1].startswith("Reasoning Effort: Max\n\n# Tools")


def test_explicit_reasoning_content_beats_alias_and_old_turns_drop_it(srv):
    msgs = [*MSG, {"role": "assistant", "content": "Paris.", "reasoning": "alias",
                   "reasoning_content": ""}, {"role": "user", "content": "And Spain?"}]
    text, _ = render(srv, msgs)
    assert "<|assistant|><think></think>Paris.<|user|>And Spain?" in text
    msgs[1] = {"role": "assistant", "content": "Paris.", "reasoning": "kept?"}
    text, _ = render(srv, msgs)  # reasoning before the last user turn is not replayed
    assert "kept?" not in text


def test_rendered_tool_call_round_trips_through_the_parser(srv):
    text, _ = render(srv, [*MSG, {"role": "assistant", "content": "", "tool_calls": [CALL]},
                           {"role": "tool", "tool_call_id": "call_1", "content": "ok"}])
    markup = text[text.index("<tool_call>"):text.index("</tool_call>") + len("</tool_call>")]
    parser = srv.engine.model.hooks.tool_call_parser(model=srv.engine.model, tools=TOOLS)
    assert isinstance(parser, StreamingToolParser)
    assert isinstance(parser.dialect, mlxbun_glm52.GlmDialect)
    events = parser.feed("Checking. " + markup) + parser.finish()
    calls = [e.call for e in events if e.kind == "tool_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris", "days": 3, "opts": {"unit": "C"}})]
    assert "".join(e.text for e in events if e.kind == "content").strip() == "Checking."


# ---------------------------------------------------------------- served

def test_thinking_output_is_routed_to_reasoning(client, srv):
    kw = dict(model="m", messages=MSG, max_tokens=4, temperature=0,
              extra_body={"chat_template_kwargs": {"enable_thinking": True}, "logprobs": True})
    full = client.chat.completions.create(**kw)
    msg = full.choices[0].message
    ids = [e["id"] if isinstance(e, dict) else e.id for e in full.choices[0].logprobs.content]
    tok = srv.engine.model.tokenizer
    said = tok.decode([i for i in ids if i not in tok.eos_token_ids])
    reasoning = (msg.model_extra or {}).get("reasoning") or ""
    # the primer left <think> open: everything up to a </think> is reasoning
    assert reasoning.strip() == said.split("</think>")[0].strip()
    if "</think>" not in said:
        assert not msg.content
    chunks = list(client.chat.completions.create(stream=True, **kw))
    streamed = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning") or ""
                       for ch in chunks)
    assert streamed == reasoning


def test_tools_request_served(client):
    r = client.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=4,
                                       temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


class TestConformance(ReasoningFamilyChecks):
    """The checks every family passes (mlxbun_core.testing.conformance)."""

    plugin = "glm52"
    fallback_template = mlxbun_glm52.fallback_template()
