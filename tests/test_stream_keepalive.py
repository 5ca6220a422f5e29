"""A stream with nothing to send yet (a long prompt being read: minutes on a CPU) sends
keep-alive frames, so clients that give up on a silent stream (Claude Code and Codex after
5 minutes) wait for the first token instead: Anthropic's ``ping`` event on /v1/messages,
``response.in_progress`` again on /v1/responses before any output, an SSE comment
otherwise."""

from __future__ import annotations

import asyncio
import threading

import anthropic
import httpx
import openai
import pytest

from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.job import EventSink
from mlxbun_core.events import KEEPALIVE, Content, Event
from mlxbun_core.server import generation
from mlxbun_core.server.openai.choices import Choices
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server


def test_silence_longer_than_the_interval_becomes_keepalives():
    async def run():
        sink = EventSink(asyncio.get_running_loop())
        late = threading.Timer(0.35, sink.post, args=([Content("a"), Content("b")],))
        late.start()  # (the worker thread posts so)
        out: list[Event] = []
        while Content("b") not in out:
            out += await sink.get(idle=0.1)
        late.join()
        return out

    out = asyncio.run(run())
    assert out[-2:] == [Content("a"), Content("b")]
    assert 2 <= len(out) - 2 <= 4 and set(out[:-2]) == {KEEPALIVE}


class Tokens(generation.FrameWriter):
    def event(self, ev):
        return [b"token"]

    def done(self, finish):
        return [b"done"]


def test_a_stream_waits_for_its_tokens_without_a_task_each():
    """A stream waits once per decode step; a task (and asyncio.wait) per wait made the
    event loop thread hold the GIL about as long as the worker at 32 streams."""
    engine = Engine.load(str(tiny_checkpoint("qwen3", seed=8)), progress=False,
                         prompt_cache_bytes=0)
    body = {"prompt": "hello there", "max_tokens": 24, "temperature": 0}

    async def run(read):
        loop = asyncio.get_running_loop()
        made = []

        def counted(loop, coro, **kw):
            made.append(coro)
            return asyncio.Task(coro, loop=loop, **kw)

        gen = await engine.start(engine.parse_completion(body))
        loop.set_task_factory(counted)
        try:
            out = [f async for f in read(gen)]
        finally:
            loop.set_task_factory(None)
        return out, len(made)

    async def choices(gen):
        async for _, ev in Choices([gen]).events():
            yield ev

    try:
        for read in (lambda gen: generation.frames(gen, Tokens()), choices):
            out, tasks = asyncio.run(run(read))
            assert len(out) >= 10 and tasks == 0, (len(out), tasks)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def srv():
    s = start_server(tiny_checkpoint("qwen3", seed=8))
    yield s
    s.stop()


def test_streams_keep_alive_on_every_surface(srv, monkeypatch):
    monkeypatch.setattr(generation, "KEEPALIVE_S", 0.0005)  # every wait outlasts it
    body = {"model": "m", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "hello " * 400}]}
    with httpx.stream("POST", srv.base_url + "/v1/messages", json=body, timeout=120) as r:
        text = "".join(r.iter_text())
    assert "event: ping" in text and text.index("event: ping") < text.index("message_stop")
    body["messages"] = [{"role": "user", "content": "world " * 400}]  # no cached prefix
    with httpx.stream("POST", srv.v1 + "/chat/completions", json=body, timeout=120) as r:
        text = "".join(r.iter_text())
    assert ": keep-alive" in text and text.rstrip().endswith("data: [DONE]")
    body["messages"] = [{"role": "user", "content": "sky " * 400}]
    with httpx.stream("POST", srv.v1 + "/responses", timeout=120, json={
            "model": "m", "max_output_tokens": 8, "stream": True,
            "input": body["messages"][0]["content"]}) as r:
        kinds = [line.removeprefix("event: ") for line in r.iter_lines()
                 if line.startswith("event: ")]
    # Codex times a stream by its events: before any output the keep-alive is one
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds.count(
        "response.in_progress") > 1 and kinds[-1] in ("response.completed", "response.incomplete")
    # the SDKs read through them
    claude = anthropic.Anthropic(base_url=srv.base_url, api_key="x", max_retries=0)
    with claude.messages.stream(model="m", max_tokens=8, messages=body["messages"]) as s:
        message = s.get_final_message()
    assert message.usage.output_tokens > 0
    oai = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    chunks = list(oai.chat.completions.create(model="m", max_tokens=8, stream=True,
                                              messages=body["messages"]))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    with oai.responses.stream(model="m", max_output_tokens=8, input="sea " * 400) as stream:
        kinds = [event.type for event in stream]
    assert kinds.count("response.in_progress") > 1
    assert kinds[-1] in ("response.completed", "response.incomplete")
