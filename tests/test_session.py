"""The per-request token → event pipeline, fed real token ids from a real tokenizer."""

from mlx_lm.tokenizer_utils import load as load_tokenizer

from mlxbun_core.engine.sampling import SamplingParams
from mlxbun_core.engine.session import GenerationRequest, GenerationSession
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.toolcalls import JsonDialect, StreamingToolParser

TOK = load_tokenizer(tiny_checkpoint("qwen3"))


def run(text, limit=None, **req):
    ids = TOK.encode(text, add_special_tokens=False)
    gen = GenerationRequest(prompt_tokens=[1, 2], sampling=SamplingParams(), **req)
    sess = GenerationSession(gen, TOK, limit)
    events = []
    for t in ids:
        events += sess.step(t, None)
        if sess.finished:
            break
    if not sess.finished:
        events += sess.step(next(iter(TOK.eos_token_ids)), None)
    return events, sess


def text_of(events, kind="content"):
    return "".join(e.text for e in events if e.kind == kind)


def test_multibyte_text_never_splits_a_character():
    text = "héllo wörld 😀 ✓ 日本"
    events, _ = run(text)
    assert all("\ufffd" not in e.text for e in events if e.kind == "content")
    assert text_of(events) == text


def test_stop_sequence_across_tokens_and_eos_counted():
    events, sess = run("alpha beta gamma delta", stop=["gamma"])
    assert text_of(events) == "alpha beta "
    assert sess.finished.reason == "stop" and sess.finished.stop_sequence == "gamma"


def test_eos_counts_as_a_completion_token():
    ids = TOK.encode("hi there", add_special_tokens=False)
    _, sess = run("hi there")
    assert sess.finished.usage.completion_tokens == len(ids) + 1


def test_length_limit():
    events, sess = run("one two three four five six", limit=3)
    assert sess.finished.reason == "length" and sess.usage.completion_tokens == 3


def test_reasoning_then_content_then_tool_call():
    tools = [{"type": "function", "function": {"name": "get", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    text = ('<think>let me see</think>\n\nSure. '
            '<tool_call>{"name": "get", "arguments": {"city": "Paris"}}</tool_call>')
    events, sess = run(text, think_start="<think>", think_end="</think>",
                       tool_parser=StreamingToolParser(JsonDialect(), tools))
    assert text_of(events, "reasoning") == "let me see"
    assert text_of(events).strip() == "Sure."
    calls = [e.call for e in events if e.kind == "tool_call"]
    assert [(c.name, c.arguments) for c in calls] == [("get", '{"city": "Paris"}')]
    assert sess.finished.reason == "tool_calls"
    kinds = [e.kind for e in events]
    assert kinds.index("reasoning") < kinds.index("content") < kinds.index("tool_call")
