"""mlxbun-minicpm5 end to end: claim, chat template behaviour, served chat, and the shared
family conformance suite (greedy parity included).

A tiny random MiniCPM5 checkpoint (``model_type: llama``, MiniCPM5's special tokens)
behind a real HTTP server, driven by the openai SDK. Random weights: only structure and
parity are asserted, never text.
"""

import json

import mlxbun_minicpm5
import pytest

from mlxbun_core import loader
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint, write_checkpoint
from mlxbun_core.testing.conformance import ReasoningFamilyChecks
from mlxbun_core.testing.engine import rendered_chat
from mlxbun_core.testing.families import family_config
from mlxbun_core.testing.tokenizer import CHATML_TEMPLATE

MSG = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"type": "function", "function": {
    "name": "write_file", "description": "Write a file",
    "parameters": {"type": "object", "properties": {
        "path": {"type": "string"}, "content": {"type": "string"},
        "mode": {"type": "integer"}, "tags": {"type": "array"}}, "required": ["path"]}}}]
CALL = {"id": "call_1", "type": "function", "function": {
    "name": "write_file", "arguments": json.dumps({
        "path": "a.txt", "content": "if a < b && c:\n  x = ']]>'\n", "mode": 420,
        "tags": ["x", 1]})}}
PRIMER_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("minicpm5", seed=7, chat_template=mlxbun_minicpm5.fallback_template())


def render(srv, messages=MSG, **body):
    """The prompt the engine would run for a chat body (normalization included)."""
    return rendered_chat(srv.engine, {"messages": messages, **body})


# ---------------------------------------------------------------- claim

def _config_dir(tmp_path, name, template):
    d = tmp_path / name
    d.mkdir()
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return d


def test_claim_signals(tmp_path):
    cfg = family_config("minicpm5")
    tpl = mlxbun_minicpm5.fallback_template()
    # the template's tool-call markup alone is enough, under any name
    assert mlxbun_minicpm5.is_minicpm5(_config_dir(tmp_path, "a", tpl), cfg)
    assert mlxbun_minicpm5.is_minicpm5(_config_dir(tmp_path, "b", [{"name": "default",
                                                                     "template": tpl}]), cfg)
    # a MiniCPM5 name (model id or directory) is enough, whatever the template
    plain = _config_dir(tmp_path, "c", CHATML_TEMPLATE)
    assert not mlxbun_minicpm5.is_minicpm5(plain, cfg)
    assert mlxbun_minicpm5.is_minicpm5(plain, cfg, "openbmb/MiniCPM5-1B")
    assert mlxbun_minicpm5.is_minicpm5(plain, cfg, "mlx-community/minicpm-5-1b-4bit")
    assert mlxbun_minicpm5.is_minicpm5(_config_dir(tmp_path, "MiniCPM5-1B-OptiQ", ""), cfg)
    # never a non-llama config, even with a MiniCPM name (older MiniCPMs are other archs)
    assert not mlxbun_minicpm5.is_minicpm5(plain, {"model_type": "minicpm"}, "MiniCPM5")
    assert not mlxbun_minicpm5.is_minicpm5(plain, family_config("llama"), "Llama-3.2-1B")
    # the hook answers with the family name, the model id coming from the load options
    named = LoadOptions(model_id="openbmb/MiniCPM5-1B")
    assert mlxbun_minicpm5.claims(plain, cfg, named) == "minicpm5"
    assert mlxbun_minicpm5.claims(plain, cfg, LoadOptions(model_id="x")) is None


def test_plain_llama_checkpoint_goes_to_generic(tmp_path):
    p = write_checkpoint(tmp_path / "model", "minicpm5", seed=7)  # ChatML template, no name
    assert loader.claim(p, LoadOptions(model_id="model")).family == "generic"


# ---------------------------------------------------------------- template

def test_default_is_direct_answer_mode(srv):
    assert srv.engine.model.config["model_type"] == "llama"  # MiniCPM5 is a llama
    text, req = render(srv)
    assert text == ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n" + PRIMER_OFF)
    assert req.in_reasoning is False and (req.think_start, req.think_end) == ("<think>", "</think>")


def test_enable_thinking_drops_the_empty_think_block(srv):
    text, req = render(srv, chat_template_kwargs={"enable_thinking": True})
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n") and "<think>" not in text


def test_tools_and_tool_history_render_natively(srv):
    msgs = [{"role": "system", "content": "Be brief."}, *MSG,
            {"role": "assistant", "content": None, "reasoning": "Save it first.",
             "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "saved"},
            {"role": "tool", "tool_call_id": "call_2", "content": "ok"}]
    text, _ = render(srv, msgs, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert '"name": "write_file"' in text and '<function name="function-name">' in text
    # the `reasoning` alias reaches the template as reasoning_content (a tool-loop turn)
    assert ('<|im_start|>assistant\n<think>\nSave it first.\n</think>\n\n'
            '<function name="write_file"><param name="path">a.txt</param>'
            '<param name="content"><![CDATA[if a < b && c:\n  x = \']]]]><![CDATA[>\'\n]]>'
            '</param><param name="mode">420</param><param name="tags">["x", 1]</param>'
            '</function><|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\nsaved\n</tool_response>\n"
                         "<tool_response>\nok\n</tool_response><|im_end|>\n" + PRIMER_OFF)


def test_explicit_reasoning_content_beats_alias_and_old_turns_drop_it(srv):
    msgs = [*MSG, {"role": "assistant", "content": "Paris.", "reasoning": "alias",
                   "reasoning_content": ""}, {"role": "user", "content": "And Spain?"}]
    text, _ = render(srv, msgs)
    assert "<|im_start|>assistant\nParis.<|im_end|>\n" in text and "alias" not in text
    msgs[1] = {"role": "assistant", "content": "Paris.", "reasoning": "kept?"}
    assert "kept?" not in render(srv, msgs)[0]


def test_rendered_tool_call_round_trips_through_the_parser(srv):
    text, _ = render(srv, [*MSG, {"role": "assistant", "content": "", "tool_calls": [CALL, CALL]},
                           {"role": "tool", "tool_call_id": "call_1", "content": "ok"}])
    markup = text[text.index("<function name="):text.rindex("</function>") + len("</function>")]
    parser = srv.engine.model.hooks.tool_call_parser(model=srv.engine.model, tools=TOOLS)
    assert isinstance(parser.dialect, mlxbun_minicpm5.MiniCPM5Dialect)
    events = []
    for i in range(0, len(markup), 7):  # streamed in small pieces
        events += parser.feed(markup[i:i + 7])
    events += parser.finish()
    args = json.loads(CALL["function"]["arguments"])
    calls = [(e.call.name, json.loads(e.call.arguments)) for e in events if e.kind == "tool_call"]
    assert calls == [("write_file", args), ("write_file", args)]
    assert not "".join(e.text for e in events if e.kind == "content").strip()


# ---------------------------------------------------------------- served

def test_tools_request_served(client):
    r = client.chat.completions.create(model="m", messages=MSG, tools=TOOLS, max_tokens=4,
                                       temperature=0, extra_body={"reasoning_effort": "high"})
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


class TestConformance(ReasoningFamilyChecks):
    """The checks every family passes (mlxbun_core.testing.conformance): served row,
    claim and generic fallback, `mlxbun plugins`, template parity, the thinking switch,
    served chat and greedy parity with mlx-lm."""

    plugin = "minicpm5"
    model_id = "MiniCPM5-1B"  # a checkpoint without the template's markup is claimed by name
    fallback_template = mlxbun_minicpm5.fallback_template()
