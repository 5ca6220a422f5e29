"""``reasoning_effort`` reaches chat templates that take a depth (as gpt-oss's and
Qwen3.8's read ``reasoning_effort``), through every family plugin's rendering and every
surface's spelling of the field; the thinking switch keeps the reference's rule ("none"
is off, any other level on) for templates with ``enable_thinking``."""

from __future__ import annotations

import anthropic
import openai
import pytest

from mlxbun_core import plugins
from mlxbun_core.engine.core import Engine
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import rendered_chat
from mlxbun_core.testing.server import start_server

# a template that takes a depth and the thinking switch, as a checkpoint may ship one
DEPTH_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
    "[effort={{ reasoning_effort | default('unset') }}]"
    "{% if enable_thinking is defined and not enable_thinking %}[think=off]"
    "{% else %}[think=on]{% endif %}")
MSG = [{"role": "user", "content": "hi"}]
# each family plugin's tiny checkpoint (its name claims it where the template does not)
FAMILIES = {"generic": "qwen3", "qwen35": "qwen3_5", "minicpm5": "minicpm5",
            "glm52": "glm_moe_dsa", "gemma4": "gemma4_text"}


def _registered(family: str) -> None:
    """The family's plugin, also where its distribution is not installed."""
    import importlib

    if family != "generic" and plugins.load_plugins().get_plugin(family) is None:
        plugins.register(importlib.import_module(f"mlxbun_{family}"), family)


@pytest.fixture(scope="module", params=list(FAMILIES))
def engine(request):
    _registered(request.param)
    e = Engine.load(str(tiny_checkpoint(FAMILIES[request.param], seed=3,
                                        chat_template=DEPTH_TEMPLATE)), progress=False)
    assert e.model.family == request.param
    yield e
    e.close()


def rendered(engine, **body) -> str:
    return rendered_chat(engine, {"messages": MSG, **body})[0]


@pytest.mark.parametrize(("effort", "think"), [
    ("none", "off"), ("minimal", "on"), ("low", "on"), ("medium", "on"), ("high", "on"),
    ("xhigh", "on")])
def test_every_family_passes_the_level_to_a_depth_template(engine, effort, think):
    text = rendered(engine, reasoning_effort=effort)
    assert f"[effort={effort}][think={think}]" in text


def test_no_level_leaves_the_template_its_default_and_its_own_kwargs_win(engine):
    assert "[effort=unset]" in rendered(engine)
    text = rendered(engine, reasoning_effort="high",
                    chat_template_kwargs={"reasoning_effort": "low", "enable_thinking": False})
    assert "[effort=low][think=off]" in text


@pytest.fixture(scope="module")
def server():
    srv = start_server(tiny_checkpoint("qwen3", seed=3, chat_template=DEPTH_TEMPLATE))
    yield srv
    srv.stop()


def test_each_surface_spelling_reaches_the_template(server):
    """Chat's ``reasoning_effort``, Responses' ``reasoning.effort`` and Anthropic's
    ``output_config.effort`` ("max" is "xhigh"): the level changes the prompt's tokens
    as the template renders it."""
    def tokens(effort: str) -> int:
        return len(server.engine.model.tokenizer.encode(f"[effort={effort}]",
                                                        add_special_tokens=False))

    oa = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x")
    chat = {e: oa.chat.completions.create(model="m", messages=MSG, max_tokens=1,
                                          reasoning_effort=e).usage.prompt_tokens
            for e in ("low", "medium")}
    assert chat["medium"] - chat["low"] == tokens("medium") - tokens("low")
    resp = oa.responses.create(model="m", input="hi", max_output_tokens=16,
                               reasoning={"effort": "medium"})
    assert resp.usage.input_tokens == chat["medium"]
    an = anthropic.Anthropic(base_url=server.base_url, api_key="x")
    msg = an.messages.create(model="m", max_tokens=1, messages=MSG,
                             extra_body={"output_config": {"effort": "max"}})
    assert msg.usage.input_tokens == chat["low"] - tokens("low") + tokens("xhigh")
