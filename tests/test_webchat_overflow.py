"""A web chat that outgrows the model's window keeps working (/ws/chat, real server, a
tiny checkpoint with a 1024-token window): by default the oldest turns are left out, with a
marker, after the context frame warned; the ``stop`` policy refuses with a clear error."""

from __future__ import annotations

import pytest

from mlxbun_core.engine.prepare import prepare
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server
from mlxbun_core.testing.wschat import ChatClient
from mlxbun_core.webchat.overflow import turns

WINDOW = 1024  # the app tools alone render to ~560 tokens
SYSTEM = "You are terse."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    ckpt = tiny_checkpoint("qwen3", config_overrides={"max_position_embeddings": WINDOW})
    s = start_server(ckpt, max_tokens=12, sessions_dir=tmp_path_factory.mktemp("sessions"))
    s.engine.defaults["logit_bias"] = {str(i): -100 for i in s.engine.model.tokenizer.eos_token_ids}
    yield s
    s.stop()


def prompt(i: int) -> str:
    return f"Message {i}: " + " ".join(f"word{i}x{j}" for j in range(12))


def test_a_long_chat_keeps_answering_by_leaving_out_the_oldest_turns(server):
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_system_prompt", text=SYSTEM)
        c.until("settings")
        warned_at = trimmed_at = None
        for i in range(12):
            frames = c.turn(text=prompt(i))
            assert not [f for f in frames if f["type"] == "error"], frames
            end = next(f for f in frames if f["type"] == "turn_end")
            assert end["finish"] in ("length", "stop")
            context = next(f for f in frames if f["type"] == "context")
            if warned_at is None and context.get("warning"):
                warned_at = i
                assert "oldest turns" in context["warning"]
            trim = [f for f in frames if f["type"] == "context_trimmed"]
            if trim and trimmed_at is None:
                trimmed_at = i
                assert trim[0]["dropped"] >= 2  # whole turns: a prompt and its answer
        assert trimmed_at is not None, "the chat never outgrew the window"
        assert warned_at is not None and warned_at < trimmed_at  # warned before it happened
        items = frames[-1]["items"]
        assert len(items) == 24  # everything is still saved and shown
        answer = items[-1]
        assert answer["role"] == "assistant" and answer["meta"]["trimmed"] >= 2


def test_what_is_sent_keeps_the_system_prompt_and_the_last_user_message(server, monkeypatch):
    sent: list = []  # every request the chat starts on the engine: what the model reads
    start = server.engine.start

    async def recording(req):
        sent.append(req)
        return await start(req)

    monkeypatch.setattr(server.engine, "start", recording)
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_system_prompt", text=SYSTEM)
        c.until("settings")
        trimmed = [bool([f for f in c.turn(text=prompt(i)) if f["type"] == "context_trimmed"])
                   for i in range(8)]
    assert any(trimmed) and len(sent) == 8
    for i, req in enumerate(sent):
        text = server.engine.model.tokenizer.decode(
            prepare(server.engine.model, server.engine.hooks, req).request.prompt_tokens)
        assert SYSTEM in text, f"turn {i} was sent without its system prompt"
        assert prompt(i) in text
        assert (prompt(0) in text) is not trimmed[i], f"turn {i}: the oldest turn"
    # the grouping the policy drops by: a turn is a user message and what answers it
    msgs = [{"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"},
            {"role": "user"}, {"role": "assistant"}, {"role": "user"}]
    assert [len(g) for g in turns(msgs)] == [4, 2, 1]


def test_the_stop_policy_refuses_with_a_clear_error_and_saves_nothing(server):
    with ChatClient(server.base_url) as c:
        c.hello()
        c.send("set_overflow", policy="stop")
        assert c.until("settings")[-1]["overflow"] == "stop"
        for i in range(12):
            c.send("prompt", text=prompt(i))
            first = c.recv()
            while first["type"] not in ("error", "turn_start"):
                first = c.recv()
            if first["type"] == "error":
                break
            c.until("turn_end")
            c.until("history")
        else:
            pytest.fail("the chat never outgrew the window")
        assert first["status"] == 400
        assert "overflow policy is 'stop'" in first["message"]
        assert "new chat" in first["message"]
        c.send("open_session", path=last_path(c))
        history = c.until("history")[-1]["items"]
        assert len(history) == 2 * i  # the refused prompt was not saved
        c.send("set_overflow", policy="sideways")
        assert "policy must be one of" in c.until("error")[-1]["message"]


def last_path(c: ChatClient) -> str:
    return next(f["activePath"] for f in reversed(c.seen)
                if f["type"] == "sessions" and f.get("activePath"))
