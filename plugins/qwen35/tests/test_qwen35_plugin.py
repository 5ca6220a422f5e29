"""The Qwen3.5 family plugin: claim, template behaviour, served chat, greedy parity vs mlx-lm."""

import asyncio
import dataclasses
import json

import httpx
import pytest
from mlx_lm import load as mlx_load
from mlxbun_qwen35 import fallback_template
from mlxbun_qwen35.toolcalls import QwenDialect

from mlxbun_core import loader
from mlxbun_core.chat_template import install_fallback_template
from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.reply import gather
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.conformance import ReasoningFamilyChecks
from mlxbun_core.testing.engine import rendered_chat
from mlxbun_core.testing.helpers import chat_both_ways, mlx_lm_greedy

MSG = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}}}}}]
GEN_ON = "<|im_start|>assistant\n<think>\n"
GEN_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3_5", seed=7, chat_template=fallback_template())


def rendered(srv, **body):
    """The prompt the engine builds for ``body`` (normalization + plugin render), as text."""
    return rendered_chat(srv.engine, {"messages": MSG, **body})


# -- claim -----------------------------------------------------------------

def test_the_moe_checkpoint_is_claimed_too():
    moe = tiny_checkpoint("qwen3_5_moe", seed=7, chat_template=fallback_template())
    assert json.loads((moe / "config.json").read_text())["architectures"] == [
        "Qwen3_5MoeForConditionalGeneration"]
    assert loader.claim(moe, LoadOptions(model_id="moe")).family == "qwen35"


def test_fallback_template_installed_when_checkpoint_has_none():
    bare = tiny_checkpoint("qwen3_5", seed=8, tokenizer_config_extra={"chat_template": None})
    m = loader.claim(bare, LoadOptions(model_id="bare"))
    assert m.extras.get("fallback_template") is True
    assert m.tokenizer.chat_template == fallback_template() and m.tokenizer.has_chat_template
    # the shared helper installs only where there is no template yet
    assert not install_fallback_template(m.tokenizer, "{{ 'other' }}")
    assert m.tokenizer.chat_template == fallback_template()
    p = m.hooks.render_chat(model=m, messages=MSG, tools=None, template_kwargs={},
                            reasoning_effort=None)
    assert p.text.endswith(GEN_ON) and p.in_reasoning


# -- template behaviour --------------------------------------------------------

def test_thinking_on_by_default(srv):
    text, req = rendered(srv)
    assert text.endswith(GEN_ON) and req.in_reasoning
    assert (req.think_start, req.think_end) == ("<think>", "</think>")


def test_tools_system_turn_tool_calls_and_responses(srv):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning": "Need the tool.",
             "tool_calls": [{"id": "c1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "warm"}]
    text, _ = rendered(srv, messages=msgs, tools=TOOLS)
    assert text.startswith("<|im_start|>system\n# Tools\n\nYou have access to the following "
                           "functions:\n\n<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>")
    assert "</IMPORTANT>\n\nBe brief.<|im_end|>\n" in text
    # the `reasoning` alias reaches the template; the call is in Qwen XML form
    assert ("<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n<tool_call>\n"
            "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call><|im_end|>\n") in text
    assert ("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n"
            "warm\n</tool_response><|im_end|>\n") in text
    assert text.endswith(GEN_ON)


def test_reasoning_only_after_last_user_query_unless_preserved(srv):
    msgs = [{"role": "user", "content": "one"},
            {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "two"}]
    text, _ = rendered(srv, messages=msgs)
    assert "<|im_start|>assistant\nA1<|im_end|>" in text and "R1" not in text
    text, _ = rendered(srv, messages=msgs, chat_template_kwargs={"preserve_thinking": True})
    assert "<|im_start|>assistant\n<think>\nR1\n</think>\n\nA1<|im_end|>" in text
    # inline <think> in content is split out the same way
    msgs[1] = {"role": "assistant", "content": "<think>\nR2\n</think>\n\nA2"}
    text, _ = rendered(srv, messages=msgs)
    assert "<|im_start|>assistant\nA2<|im_end|>" in text and "R2" not in text


def test_system_not_first_is_folded_into_the_user_turn(srv):
    """The template raises for a system message that is not first; the core folds one
    into the user turn it follows instead (mlxbun_core.system_turns)."""
    msgs = MSG + [{"role": "system", "content": "late"}]
    text, _ = rendered(srv, messages=msgs)
    assert "<|im_start|>user\nWhat is the capital of France?\n\nlate<|im_end|>" in text
    r = httpx.post(srv.v1 + "/chat/completions", json={"messages": msgs, "max_tokens": 2},
                   timeout=30)
    assert r.status_code == 200


def test_tool_call_parser_is_qwen_dialect_only_for_own_models(srv):
    """The core routes: the same checkpoint claimed by generic never reaches this plugin."""
    model = srv.engine.model
    assert model.plugin == "qwen35"
    assert isinstance(model.hooks.tool_call_parser(model=model, tools=TOOLS).dialect, QwenDialect)
    other = dataclasses.replace(model, family="generic", plugin="generic")
    parser = other.hooks.tool_call_parser(model=other, tools=TOOLS)
    assert parser is not None and not isinstance(parser.dialect, QwenDialect)


# -- served end to end -------------------------------------------------------------

@pytest.mark.parametrize("thinking", [True, False])
def test_served_chat_stream_matches_non_stream(client, thinking):
    kw = dict(model="m", messages=MSG, max_tokens=10, temperature=0, tools=TOOLS,
              extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
    chat_both_ways(client, **kw)


def test_moe_engine_greedy_parity():
    """The MoE variant through the engine (no second HTTP server in this process)."""
    moe = tiny_checkpoint("qwen3_5_moe", seed=7, chat_template=fallback_template())
    engine = Engine.load(str(moe), progress=False)
    try:
        assert engine.model.family == "qwen35"

        async def run():
            gen = await engine.start(engine.parse_chat({"messages": MSG, "max_tokens": 8,
                                                         "temperature": 0, "logprobs": True}))
            return gather([ev async for ev in gen.events()])

        ours = [e["id"] for e in asyncio.run(run()).finish.logprobs]
    finally:
        engine.worker.close()
    model, tok = mlx_load(str(moe))
    text = tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=False)
    assert text.endswith(GEN_ON)
    assert ours == mlx_lm_greedy(model, tok.encode(text, add_special_tokens=False), 8,
                              tok.eos_token_ids)


class TestConformance(ReasoningFamilyChecks):
    """The checks every family passes (mlxbun_core.testing.conformance)."""

    plugin = "qwen35"
    fallback_template = fallback_template()
