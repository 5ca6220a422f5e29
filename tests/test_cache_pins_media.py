"""Prompt caching with images: a ``cache_control`` breakpoint after an image (or in a
later turn of a conversation with one) pins that prefix in the media prompt's own cache
namespace, the next request with the same image resumes from it (the image tokens are
not read again) and answers as an uncached read does; another image reads nothing.
Tiny Qwen3-VL (3D rotary positions: the resumed read must continue them) and Gemma 4
checkpoints through the Anthropic SDK against a real server."""

from __future__ import annotations

import base64

import anthropic
import pytest

from mlxbun_core.engine.cache_pins import Pins
from mlxbun_core.testing import media as M
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import settled
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.vision import QWEN_VL_TEMPLATE

EPHEMERAL = {"type": "ephemeral"}
RED, NOISE = (M.image_bytes("PNG", size=(64, 48), color=(200, 30, 30)),
              M.image_bytes("PNG", size=(64, 48), seed=3))


def _checkpoint(family: str):
    if family == "gemma4":  # 1D positions, bidirectional attention over image tokens
        from mlxbun_gemma4 import fallback_template

        return tiny_checkpoint("gemma4", seed=2, vision=True, chat_template=fallback_template())
    return tiny_checkpoint("qwen3_vl", seed=4, vision=True, chat_template=QWEN_VL_TEMPLATE)


@pytest.fixture(scope="module", params=["qwen3_vl", "gemma4"])
def server(request):
    s = start_server(_checkpoint(request.param))
    yield s
    s.stop()


@pytest.fixture
def client(server):
    def reset():
        prefix = server.engine.prefix
        prefix.clear()
        prefix.pins = Pins()
        prefix.max_bytes = 1 << 30

    server.engine.worker.run_sync(reset, timeout=60)
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


def _image(data: bytes, mark=None) -> dict:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(data).decode()}}
    return {**block, "cache_control": mark} if mark else block


def _ask(client, messages, n=6):
    r = client.messages.create(model="m", max_tokens=n, extra_body={"temperature": 0},
                               system="You describe pictures. " * 8, messages=messages)
    return r.usage, r.content[0].text if r.content else ""


def _pressure(client, server) -> None:
    """Text prompts (unpinned) until the byte cap has evicted entries."""
    before = sum(server.engine.prefix.stats()["evicted"].values())
    for i in range(8):
        _ask(client, [{"role": "user", "content": f"Plain question {i}. " * 30}], n=2)
        settled(server.engine)
        if sum(server.engine.prefix.stats()["evicted"].values()) > before + 2:
            return
    raise AssertionError("no eviction")


def test_a_breakpoint_after_an_image_survives_lru_pressure(client, server):
    turn = [{"role": "user", "content": [_image(RED, EPHEMERAL), {"type": "text",
                                                                  "text": "What is it?"}]}]
    first, said = _ask(client, turn)
    assert first.cache_read_input_tokens == 0 and first.cache_creation_input_tokens > 40
    settled(server.engine)
    stats = server.engine.prefix.stats()  # a cap of about three entries of this size
    server.engine.prefix.max_bytes = 3 * stats["bytes"] // max(1, stats["entries"])
    _pressure(client, server)
    again, said_again = _ask(client, turn)
    assert again.cache_read_input_tokens == first.cache_creation_input_tokens
    assert again.input_tokens == first.input_tokens and said_again == said
    other = [{"role": "user", "content": [_image(NOISE, EPHEMERAL), turn[0]["content"][1]]}]
    third, _ = _ask(client, other)
    assert third.cache_read_input_tokens == 0 and third.cache_creation_input_tokens > 40


def test_a_later_turn_of_a_conversation_with_an_image_resumes_after_it(client, server):
    """The rolling pattern: each turn marks its last message; the next turn reads the
    last one's prefix, image and all, and answers as a cold read of the same prompt."""
    history = [{"role": "user", "content": [_image(RED), {"type": "text", "text": "Look."}]},
               {"role": "assistant", "content": "A red square."},
               {"role": "user", "content": [{"type": "text", "text": "Its shape?",
                                             "cache_control": EPHEMERAL}]}]
    first, _ = _ask(client, history)
    assert first.cache_creation_input_tokens > 40
    settled(server.engine)
    history[2]["content"][0].pop("cache_control")
    longer = history + [{"role": "assistant", "content": "Square."},
                        {"role": "user", "content": [{"type": "text", "text": "And size?",
                                                      "cache_control": EPHEMERAL}]}]
    second, warm = _ask(client, longer)
    assert second.cache_read_input_tokens >= first.cache_creation_input_tokens
    settled(server.engine)
    server.engine.worker.run_sync(server.engine.prefix.clear, timeout=60)
    cold_usage, cold = _ask(client, longer)
    assert cold_usage.cache_read_input_tokens == 0 and warm == cold
