"""The Gemma 4 family end to end: claim, chat format, thinking switches, tool markup in
prompts, a real server driven by the openai SDK, and greedy parity with mlx-lm.

Tiny random checkpoints: assert structure and token parity, never generated text."""

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlxbun_gemma4 as g4
import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core import loader, plugins
from mlxbun_core.engine.sampling import SamplingParams
from mlxbun_core.engine.session import GenerationRequest, GenerationSession
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.conformance import ReasoningFamilyChecks
from mlxbun_core.testing.engine import prepare_chat, rendered_chat
from mlxbun_core.testing.helpers import chat_both_ways, mlx_lm_greedy, unregistered
from mlxbun_core.testing.server import start_server

Q = '<|"|>'
GEN_OFF = "<|turn>model\n<|channel>thought\n<channel|>"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name"},
        "days": {"type": "integer"}}}}}]
USER = [{"role": "user", "content": "Weather in Paris?"}]


def _ensure_registered():
    """Tests also run from a checkout where the distribution is not installed."""
    if plugins.load_plugins().get_plugin("gemma4") is None:
        plugins.register(g4, "gemma4")


CKPTS = {
    "gemma4_text": dict(seed=11, chat_template=None),  # filled below: our template, shipped
    "gemma4": dict(seed=12, tokenizer_config_extra={"chat_template": None}),  # ships none
}


def ckpt(model_type):
    kw = dict(CKPTS[model_type])
    if "chat_template" in kw:
        kw["chat_template"] = g4.fallback_template()
    return tiny_checkpoint(model_type, **kw)


@pytest.fixture(scope="module", params=list(CKPTS))
def srv(request):
    """One server per checkpoint, one at a time."""
    _ensure_registered()
    s = start_server(ckpt(request.param))
    yield s
    s.stop()


def client(s):
    return openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0)


def rendered(s, **body) -> str:
    """The prompt text the engine would run, through the same path as a request."""
    body.setdefault("messages", USER)
    return rendered_chat(s.engine, body)[0]


# -- chat template ------------------------------------------------------------

def test_plain_conversation_exact_format(srv):
    msgs = [{"role": "system", "content": " Be brief. "}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again"}]
    assert rendered(srv, messages=msgs) == (
        "<bos><|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n"
        "<|turn>model\nHello.<turn|>\n<|turn>user\nAgain<turn|>\n" + GEN_OFF)


def test_thinking_off_by_default(srv):
    text = rendered(srv)
    assert text == "<bos><|turn>user\nWeather in Paris?<turn|>\n" + GEN_OFF
    assert "<|think|>" not in text


@pytest.mark.parametrize("on", [True, False])
def test_thinking_switches(srv, on):
    """Gemma 4's markup for each; which setting wins is the conformance suite's check."""
    body = {"chat_template_kwargs": {"enable_thinking": on}}
    text = rendered(srv, **body)
    if on:
        assert text.startswith("<bos><|turn>system\n<|think|>\n<turn|>\n")
        assert text.endswith("<|turn>model\n") and not text.endswith(GEN_OFF)
    else:
        assert "<|think|>" not in text and text.endswith(GEN_OFF)
    prompt = prepare_chat(srv.engine, {"messages": USER, **body}).request
    assert (prompt.think_start, prompt.think_end) == ("<|channel>thought", "<channel|>")
    assert prompt.in_reasoning is False


def test_thinking_keeps_system_prompt(srv):
    msgs = [{"role": "system", "content": "Be brief."}] + USER
    text = rendered(srv, messages=msgs, chat_template_kwargs={"enable_thinking": True})
    assert text.startswith("<bos><|turn>system\n<|think|>\nBe brief.<turn|>\n")


def _tool_turn(**extra):
    return [*USER, {"role": "assistant", "content": None, **extra, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"days": 3, "city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"}]


# TOOLS as Gemma 4 declares them, written out by hand
DECL = (f"<|tool>declaration:get_weather{{description:{Q}Current weather{Q},parameters:{{"
        f"properties:{{city:{{description:{Q}City name{Q},type:{Q}STRING{Q}}},"
        f"days:{{type:{Q}INTEGER{Q}}}}},required:[{Q}city{Q}],type:{Q}OBJECT{Q}}}}}<tool|>")


def test_tools_and_tool_round_trip_render_natively(srv):
    text = rendered(srv, messages=_tool_turn(), tools=TOOLS)
    assert text == (
        f"<bos><|turn>system\n{DECL}<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n"
        f"<|turn>model\n<|tool_call>call:get_weather{{city:{Q}Paris{Q},days:3}}<tool_call|>"
        f"<|tool_response>response:get_weather{{value:{Q}sunny, 21C{Q}}}<tool_response|>")
    # the model turn stays open after tool results: no new generation prompt


def test_pending_tool_call_hands_over(srv):
    msgs = _tool_turn()[:-1]
    assert rendered(srv, messages=msgs, tools=TOOLS).endswith("<tool_call|><|tool_response>")


def test_tool_choice_none_drops_declarations(srv):
    assert "<|tool>" not in rendered(srv, tools=TOOLS, tool_choice="none")


def test_reasoning_alias_reaches_template(srv):
    text = rendered(srv, messages=_tool_turn(reasoning="look it up"), tools=TOOLS)
    assert "<|turn>model\n<|channel>thought\nlook it up\n<channel|><|tool_call>call:" in text
    text = rendered(srv, messages=_tool_turn(reasoning_content="canonical", reasoning="alias"))
    assert "thought\ncanonical\n" in text and "alias" not in text
    # an explicit empty reasoning_content wins over the alias
    text = rendered(srv, messages=_tool_turn(reasoning_content="", reasoning="alias"))
    assert "alias" not in text and "<|channel>" not in text.split("<|turn>model\n")[1]


def test_old_thoughts_not_replayed(srv):
    msgs = [*USER, {"role": "assistant", "content": "<|channel>thought\nhmm<channel|>Sunny.",
                    "reasoning": "hmm"}, {"role": "user", "content": "Thanks"}]
    text = rendered(srv, messages=msgs)
    assert "<|turn>model\nSunny.<turn|>\n" in text and "hmm" not in text


def test_session_routes_thought_channel_and_tool_call(srv):
    """The real tokenizer's decoded markers drive reasoning / tool-call routing."""
    model = srv.engine.model
    prompt = g4.render_chat(model, USER, TOOLS, {"enable_thinking": True}, None)
    req = GenerationRequest(prompt_tokens=prompt.tokens, sampling=SamplingParams(),
                            think_start=prompt.think_start, think_end=prompt.think_end,
                            in_reasoning=prompt.in_reasoning,
                            tool_parser=g4.tool_call_parser(model, TOOLS))
    tok = model.tokenizer
    sess = GenerationSession(req, tok, None)
    out = (f"<|channel>thought\nneed data<channel|>Let me check."
           f"<|tool_call>call:get_weather{{city:{Q}Paris{Q}}}<tool_call|>")
    events = []
    ids = tok.encode(out, add_special_tokens=False)
    for t in ids + [tok.convert_tokens_to_ids("<|tool_response>")]:
        events += sess.step(t, None)
    kinds = {}
    for ev in events:
        if ev.kind in ("reasoning", "content"):
            kinds[ev.kind] = kinds.get(ev.kind, "") + ev.text
    # the framing newline dropped
    assert kinds == {"reasoning": "need data", "content": "Let me check."}
    (call,) = [ev.call for ev in events if ev.kind == "tool_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    assert events[-1].kind == "done" and events[-1].finish.reason == "tool_calls"


# -- claim ----------------------------------------------------------------------

def test_claims_real_model_types_and_architectures():
    assert g4.claims({"model_type": "gemma4"}) and g4.claims({"model_type": "gemma4_text"})
    assert g4.claims({"architectures": ["Gemma4ForCausalLM"]})
    assert g4.claims({"architectures": ["Gemma4ForConditionalGeneration"]})
    assert not g4.claims({"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"]})


def test_eos_tokens_sampling_defaults_and_window(srv):
    m = srv.engine.model
    assert {1, 6}.issubset(m.eos_token_ids)  # <eos>, <turn|>
    assert m.tokenizer.convert_tokens_to_ids("<|tool_response>") in m.eos_token_ids
    assert m.generation_defaults == {"temperature": 1.0, "top_p": 0.95, "top_k": 64}
    assert m.context_window == 262144


def test_generic_claims_when_unregistered():
    _ensure_registered()
    with unregistered("gemma4"):
        m = loader.claim(Path(ckpt("gemma4_text")), LoadOptions(model_id="t"))
        assert (m.family, m.plugin) == ("generic", "generic")
    # with gemma4 back, the core still never asks it about a model generic claimed
    assert [i.plugin_name for i in m.hooks.render_chat.get_hookimpls()] == ["generic"]
    assert not isinstance(m.hooks.tool_call_parser(model=m, tools=TOOLS).dialect, g4.Gemma4Dialect)


def _cli_plugins(**env):
    exe = Path(sys.executable).with_name("mlxbun")
    out = subprocess.run([str(exe), "plugins"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, **env}, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line and not line.startswith(" ")]


# -- served ---------------------------------------------------------------------

def test_served_chat_with_tools_stream_and_not(srv):
    full, chunks = chat_both_ways(client(srv), model="m", messages=USER, max_tokens=10,
                                  temperature=0, tools=TOOLS)
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_greedy_parity_with_mlx_lm(srv):
    """The prompt is Gemma 4's format written out by hand and tokenized by mlx-lm, not
    rendered by our engine: a template or tokenization slip cannot cancel out."""
    text = f"<bos><|turn>system\n{DECL}<turn|>\n<|turn>user\nWeather in Paris?<turn|>\n{GEN_OFF}"
    model, tok = mlx_load(str(srv.engine.model.path))
    prompt = tok.encode(text, add_special_tokens=False)
    assert prompt[0] == tok.bos_token_id and prompt.count(tok.bos_token_id) == 1
    r = client(srv).chat.completions.create(model="m", max_tokens=16, temperature=0,
                                            messages=USER, tools=TOOLS,
                                            extra_body={"logprobs": True})
    assert r.usage.prompt_tokens == len(prompt)
    ours = [e.model_dump()["id"] for e in r.choices[0].logprobs.content]
    assert ours == mlx_lm_greedy(model, prompt, 16, srv.engine.model.eos_token_ids)


class TestConformance(ReasoningFamilyChecks):
    """The checks every family passes (mlxbun_core.testing.conformance), on both
    checkpoints (``srv`` above)."""

    plugin = "gemma4"
    fallback_template = g4.fallback_template()
