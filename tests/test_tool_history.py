"""Tool-call history as templates read it, tool_choice parsing, and closed schemas."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxbun_core.chat_template import apply_template
from mlxbun_core.errors import BadRequest
from mlxbun_core.grammar.schema import closed
from mlxbun_core.model import LoadedModel
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.toolcalls import ToolChoice, parse_parallel, parse_tool_choice
from mlxbun_core.toolcalls.history import normalize_history, without_tool_support

# SmolLM2-135M-Instruct's own template: it indexes message['content'] and knows no tools
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
           "Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
           "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
           "{{ '<|im_start|>assistant\n' }}{% endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
ROUND_TRIP = [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "tool_calls": [CALL]},
              {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def test_history_gets_the_fields_templates_read():
    msgs = normalize_history(ROUND_TRIP + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c2", "function": {"name": "f", "arguments": "{'a': True,}"}},
            {"id": "c3", "function": {"name": "g", "arguments": "[1, 2]"}},
            {"id": "c4", "function": {"name": "h"}}]}])
    assert msgs[1]["content"] == "" and msgs[1]["tool_calls"][0]["function"]["arguments"] == {
        "city": "Paris"}
    assert msgs[2]["name"] == "get_weather"          # a tool result named after its call
    calls = msgs[3]["tool_calls"]
    assert msgs[3]["content"] == "" and calls[0]["type"] == "function"
    assert calls[0]["function"]["arguments"] == {"a": True}   # repaired
    assert calls[1]["function"]["arguments"] == "[1, 2]"      # not an object: left as sent
    assert calls[2]["function"]["arguments"] == {}
    assert ROUND_TRIP[1] == {"role": "assistant", "tool_calls": [CALL]}  # inputs untouched
    for bad in ["x", ["x"], [{"function": {"arguments": "{}"}}]]:
        with pytest.raises(BadRequest):
            normalize_history([{"role": "assistant", "tool_calls": bad}])


def test_history_arguments_with_non_ascii_bare_keys_are_repaired():
    """A client's own tool-call arguments in the history, a bare key not in ASCII: taken
    as the key it is (it used to crash the repair, a 500 for the request)."""
    msgs = normalize_history([{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "function": {"name": "f", "arguments": "{stadt: 'Köln', ölstand: 2}"}}]}])
    assert msgs[0]["tool_calls"][0]["function"]["arguments"] == {"stadt": "Köln", "ölstand": 2}


def test_round_trip_renders_on_a_template_without_tool_support():
    """The regression behind ``prompt build failed: 'dict object' has no attribute
    'content'``: tools go into the system turn, the call into the assistant's text."""
    tok = load_tokenizer(tiny_checkpoint("llama", seed=3))
    model = LoadedModel(id="m", path=None, config={}, model=None, tokenizer=tok, family="generic")
    with pytest.raises(Exception, match="has no attribute 'content'"):  # the template alone
        tok.apply_chat_template(ROUND_TRIP, chat_template=SMOLLM2, tokenize=False)
    prompt = apply_template(model, normalize_history(ROUND_TRIP), TOOLS, {},
                            chat_template=SMOLLM2)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in prompt.text
    assert "<tools>" in prompt.text and "SmolLM" not in prompt.text  # our system turn
    assert prompt.text.endswith("<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n")


def test_templates_with_tool_support_are_left_alone():
    msgs = normalize_history(ROUND_TRIP)
    template = "{% for m in messages %}{{ m.tool_calls }}{% endfor %}{{ tools }}"
    assert without_tool_support(msgs, TOOLS, template) is msgs
    only_calls = without_tool_support(msgs, TOOLS, "{{ messages[0].tool_calls }}")
    assert only_calls[0]["role"] == "system" and only_calls[2] == msgs[1]


@pytest.mark.parametrize("value,tools,want", [
    (None, TOOLS, ToolChoice("auto")),
    ("none", None, ToolChoice("none")),
    ("required", TOOLS, ToolChoice("required")),
    ({"type": "function", "function": {"name": "get_weather"}}, TOOLS,
     ToolChoice("function", "get_weather")),
])
def test_tool_choice_forms(value, tools, want):
    assert parse_tool_choice(value, tools) == want


@pytest.mark.parametrize("value,tools,match", [
    ("any", TOOLS, "tool_choice must be"),
    ({"type": "function", "function": {}}, TOOLS, "name must be"),
    ({"type": "function", "function": {"name": "nope"}}, TOOLS, "not among the tools"),
    ("required", None, "needs tools"),
])
def test_bad_tool_choice_is_a_400(value, tools, match):
    with pytest.raises(BadRequest, match=match) as e:
        parse_tool_choice(value, tools)
    assert e.value.param == "tool_choice"


def test_parallel_tool_calls():
    assert parse_parallel(None) is True and parse_parallel(False) is False
    with pytest.raises(BadRequest):
        parse_parallel("no")


def test_object_schemas_are_closed_unless_they_say_otherwise():
    s = closed({"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "b": {"type": "object", "properties": {}, "additionalProperties": True},
        "c": {"type": "object"},
        "d": {"type": "array", "items": {"properties": {"y": {}}}},
        "e": {"allOf": [{"properties": {"p": {}}}, {"properties": {"q": {}}}]},
        "f": {"$ref": "#/$defs/F"}},
        "$defs": {"F": {"type": "object", "properties": {"z": {}}}}})
    p = s["properties"]
    assert s["additionalProperties"] is False and p["a"]["additionalProperties"] is False
    assert p["b"]["additionalProperties"] is True and "additionalProperties" not in p["c"]
    assert p["d"]["items"]["additionalProperties"] is False
    assert all("additionalProperties" not in x for x in p["e"]["allOf"])
    assert s["$defs"]["F"]["additionalProperties"] is False
