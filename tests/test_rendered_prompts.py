"""What each surface puts in front of the model: the prompt the (scripted) model really ran.

A scripted model answers the same whatever it was shown, so surface tests pass even when a
system block or a tool result is lost on the way. These tests read the prompt back from the
model's own forward pass and look for every piece the client sent.
"""

from __future__ import annotations

import anthropic
import openai
import pytest

from scripted_model import scripted_server

# renders everything a chat request can carry, in plain markers the tests can find
# (HF renders with trim_blocks: a newline right after a block tag is dropped)
TEMPLATE = (
    "{% for t in tools or [] %}<tool>{{ t.function.name }}: {{ t.function.description }}"
    "</tool>\n{% endfor %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}"
    "{% if m.tool_call_id %} [{{ m.tool_call_id }}]{% endif %}{{ '\\n' + (m.content or '') }}"
    "{% for c in m.tool_calls or [] %}<call id={{ c.id }}>{{ c.function.name }}"
    "{{ c.function.arguments | tojson }}</call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ANSWER = "Noted."


@pytest.fixture(scope="module")
def server():
    with scripted_server(ANSWER, name="scripted-prompts", seed=4343,
                         chat_template=TEMPLATE) as (srv, plugin):
        yield srv, plugin


@pytest.fixture
def seen(server):
    """Call it after a request: the prompt text the model ran for it."""
    _, plugin = server
    before = len(plugin.prompts)

    def last() -> str:
        assert len(plugin.prompts) == before + 1, "the model ran no new prompt"
        return plugin.prompts[-1]
    return last


@pytest.fixture
def claude(server):
    return anthropic.Anthropic(base_url=server[0].base_url, api_key="x", max_retries=0)


@pytest.fixture
def oai(server):
    return openai.OpenAI(base_url=server[0].v1, api_key="x", max_retries=0)


def in_order(text: str, *pieces: str):
    at = 0
    for p in pieces:
        found = text.find(p, at)
        assert found >= 0, f"{p!r} missing (after offset {at}) in:\n{text}"
        at = found + len(p)


# -- Anthropic Messages -------------------------------------------------------------

def test_anthropic_every_system_block_reaches_the_prompt(claude, seen):
    msg = claude.messages.create(model="m", max_tokens=8, messages=[
        {"role": "user", "content": "Hi"}], system=[
        {"type": "text", "text": "First rule."}, {"type": "text", "text": " Second rule."},
        {"type": "text", "text": " Third rule."}])
    assert msg.content[0].text == ANSWER
    in_order(seen(), "<|im_start|>system\nFirst rule. Second rule. Third rule.<|im_end|>",
             "<|im_start|>user\nHi<|im_end|>", "<|im_start|>assistant\n")


def test_anthropic_system_string(claude, seen):
    claude.messages.create(model="m", max_tokens=8, system="Only rule.",
                           messages=[{"role": "user", "content": "Hi"}])
    in_order(seen(), "<|im_start|>system\nOnly rule.<|im_end|>", "<|im_start|>user\nHi")


def test_anthropic_tool_use_and_results_reach_the_prompt(claude, seen):
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    claude.messages.create(model="m", max_tokens=8, tools=tools, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Paris"},
                                     {"type": "text", "text": " and Rome?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "tu_1", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "tu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu_1",
             "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": ", 24C"}]},
            {"type": "tool_result", "tool_use_id": "tu_2", "content": "no data", "is_error": True},
            {"type": "text", "text": "Summarize."}]}])
    in_order(seen(), "<tool>get_weather: Weather for a city</tool>",
             "<|im_start|>user\nParis and Rome?<|im_end|>",
             "<|im_start|>assistant\nChecking.",
             '<call id=tu_1>get_weather{"city": "Paris"}</call>',
             '<call id=tu_2>get_weather{"city": "Rome"}</call>',
             "<|im_start|>tool [tu_1]\nsunny, 24C<|im_end|>",
             "<|im_start|>tool [tu_2]\nError: no data<|im_end|>",
             "<|im_start|>user\nSummarize.<|im_end|>", "<|im_start|>assistant\n")


def test_anthropic_count_tokens_counts_the_same_prompt(claude, seen, server):
    """count_tokens renders what messages.create runs: same prompt, same count."""
    body = dict(model="m", system=[{"type": "text", "text": "A."}, {"type": "text", "text": "B."}],
                messages=[{"role": "user", "content": "Hi"}])
    counted = claude.messages.count_tokens(**body).input_tokens
    msg = claude.messages.create(max_tokens=4, **body)
    assert msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) == counted
    assert "<|im_start|>system\nA.B.<|im_end|>" in seen()


# -- OpenAI chat ----------------------------------------------------------------------

def test_chat_system_developer_parts_and_tool_messages(oai, seen):
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look it up",
                                               "parameters": {"type": "object"}}}]
    r = oai.chat.completions.create(model="m", max_tokens=8, tools=tools, messages=[
        {"role": "system", "content": "Sys."},
        {"role": "developer", "content": "Dev."},
        {"role": "user", "content": [{"type": "text", "text": "part one"},
                                     {"type": "text", "text": " part two"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "lookup", "arguments": '{"q": "x"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "result body"},
        {"role": "tool", "tool_call_id": "call_10",
         "content": [{"type": "text", "text": "second"}, {"type": "text", "text": " result"}]}])
    assert r.choices[0].message.content == ANSWER
    in_order(seen(), "<tool>lookup: Look it up</tool>",
             "<|im_start|>system\nSys.<|im_end|>", "<|im_start|>system\nDev.<|im_end|>",
             "<|im_start|>user\npart one part two<|im_end|>",
             '<call id=call_9>lookup{"q": "x"}</call>',
             "<|im_start|>tool [call_9]\nresult body<|im_end|>",
             "<|im_start|>tool [call_10]\nsecond result<|im_end|>", "<|im_start|>assistant\n")


def test_chat_tool_choice_none_drops_tool_definitions(oai, seen):
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look it up",
                                               "parameters": {"type": "object"}}}]
    oai.chat.completions.create(model="m", max_tokens=4, tools=tools, tool_choice="none",
                                messages=[{"role": "user", "content": "Hi"}])
    assert "<tool>" not in seen()


# -- OpenAI Responses -------------------------------------------------------------------

def test_responses_instructions_items_and_function_output(oai, seen):
    tools = [{"type": "function", "name": "lookup", "description": "Look it up",
              "parameters": {"type": "object"}}]
    r = oai.responses.create(model="m", max_output_tokens=8, instructions="Instr.", tools=tools,
                             input=[
        {"role": "developer", "content": "Dev item."},
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Find"},
                     {"type": "input_text", "text": " it"}]},
        {"type": "function_call", "call_id": "fc_1", "name": "lookup", "arguments": '{"q": "it"}'},
        {"type": "function_call_output", "call_id": "fc_1", "output": "found it"}])
    assert r.output_text == ANSWER
    in_order(seen(), "<tool>lookup: Look it up</tool>",
             "<|im_start|>system\nInstr.\n\nDev item.<|im_end|>",
             "<|im_start|>user\nFind it<|im_end|>",
             '<call id=fc_1>lookup{"q": "it"}</call>',
             "<|im_start|>tool [fc_1]\nfound it<|im_end|>", "<|im_start|>assistant\n")


def test_responses_resumption_replays_the_earlier_turns(oai, server):
    _, plugin = server
    first = oai.responses.create(model="m", max_output_tokens=8, instructions="Keep me.",
                                 input="first question")
    second = oai.responses.create(model="m", max_output_tokens=8, previous_response_id=first.id,
                                  input=[{"type": "function_call_output", "call_id": "c1",
                                          "output": "tool said hi"},
                                         {"role": "user", "content": "second question"}])
    assert second.output_text == ANSWER
    in_order(plugin.prompts[-1], "<|im_start|>system\nKeep me.<|im_end|>",
             "<|im_start|>user\nfirst question<|im_end|>",
             f"<|im_start|>assistant\n{ANSWER}<|im_end|>",
             "<|im_start|>tool [c1]\ntool said hi<|im_end|>",
             "<|im_start|>user\nsecond question<|im_end|>", "<|im_start|>assistant\n")
