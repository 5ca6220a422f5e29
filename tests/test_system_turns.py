"""System messages after the first turn, rendered as each real template can.

Templates are the real ones: the test checkpoints' ChatML (a system turn anywhere) and
the Qwen3.5 template shipped by the qwen35 plugin, which raises ``System message must be
at the beginning`` for one that is not first; its prompt is rendered by the real
tokenizer through :func:`mlxbun_core.chat_template.apply_template`.
"""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer
from mlxbun_qwen35 import fallback_template as qwen35_template

from mlxbun_core import system_turns
from mlxbun_core.chat_template import apply_template
from mlxbun_core.model import LoadedModel
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.tokenizer import CHATML_TEMPLATE

ENV = "# Environment\nPrimary working directory: /tmp/project"
TURN_1 = [{"role": "system", "content": "You are an agent."},
          {"role": "user", "content": "say hi"},
          {"role": "system", "content": ENV}]
TURN_2 = TURN_1 + [{"role": "assistant", "content": "hi"},
                   {"role": "user", "content": "thanks"}]


@pytest.fixture(scope="module")
def model():
    tok = load_tokenizer(tiny_checkpoint("qwen3", seed=3))
    return LoadedModel(id="m", path=None, config={}, model=None, tokenizer=tok, family="generic")


def render(model, messages, template, **kwargs) -> str:
    return apply_template(model, messages, None, kwargs, chat_template=template).text


def test_a_template_that_shows_inner_system_turns_gets_them_in_place(model):
    text = render(model, TURN_1, CHATML_TEMPLATE)
    assert text.endswith("<|im_start|>user\nsay hi<|im_end|>\n<|im_start|>system\n" + ENV
                         + "<|im_end|>\n<|im_start|>assistant\n")


def test_a_template_that_refuses_them_gets_them_folded(model):
    template = qwen35_template()
    with pytest.raises(Exception, match="System message must be at the beginning"):
        model.tokenizer.apply_chat_template(TURN_1, chat_template=template, tokenize=False)
    text = render(model, TURN_1, template, enable_thinking=False)
    assert "<|im_start|>user\nsay hi\n\n" + ENV + "<|im_end|>" in text
    assert text.count("<|im_start|>system") == 1
    # the next turn renders the earlier ones the same: the prefix cache still matches
    later = render(model, TURN_2, template, enable_thinking=False)
    assert later.startswith(text.removesuffix("<|im_start|>assistant\n<think>\n\n</think>\n\n"))


def test_fold_rules():
    fold = system_turns.fold
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert fold([{"role": "system", "content": "a"}, {"role": "system", "content": "b"},
                 {"role": "user", "content": "q"}]) == [
        {"role": "system", "content": "a\n\nb"}, {"role": "user", "content": "q"}]
    # after an assistant turn: into the next user turn (past tool results), else its own
    assert fold([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                 {"role": "system", "content": "s"}, {"role": "tool", "content": "r"},
                 {"role": "user", "content": "q2", "name": "me"}])[2:] == [
        {"role": "tool", "content": "r"}, {"role": "user", "content": "s\n\nq2", "name": "me"}]
    assert fold([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
                 {"role": "system", "content": "s"}])[-1] == {"role": "user", "content": "s"}
    # part lists stay part lists (an image keeps its place)
    assert fold([{"role": "user", "content": parts}, {"role": "system", "content": "s"}]) == [
        {"role": "user", "content": parts + [{"type": "text", "text": "\n\n"},
                                             {"type": "text", "text": "s"}]}]


def test_the_probe_is_remembered_per_template():
    calls = []

    def refusing(messages):
        calls.append(len(messages))
        raise ValueError("System message must be at the beginning.")

    key = "a template that refuses " + str(id(calls))
    assert system_turns.for_template(TURN_1, refusing, key)[-1]["role"] == "user"
    assert system_turns.for_template(TURN_2, refusing, key)[1]["role"] == "user"
    assert len(calls) == 1
    assert system_turns.for_template(TURN_1[:2], refusing, "never probed") == TURN_1[:2]
