"""Conversation turns for tests that hold a served answer against a cold one: a greedy
chat body that reports token ids, one turn over HTTP, the same body run on an engine, and
the next turn of a conversation."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from ..engine.core import Engine
from ..engine.reply import Reply, gather
from .engine import token_ids

SYSTEM = {"role": "system", "content": "You are terse. " * 8}


def greedy_chat(messages: list, n: int = 6) -> dict[str, Any]:
    """A greedy chat body of at most ``n`` tokens that reports their ids."""
    return {"messages": messages, "max_tokens": n, "temperature": 0, "logprobs": True}


def engine_reply(engine: Engine, body: dict[str, Any]) -> Reply:
    """A chat ``body`` run on ``engine`` (no HTTP), gathered."""
    async def go() -> Reply:
        gen = await engine.start(engine.parse_chat(body))
        return gather([ev async for ev in gen.events()])

    return asyncio.run(go())


def turn(base: str, messages: list, n: int = 6) -> dict[str, Any]:
    """One greedy turn on the server at ``base``: its JSON answer (a 200, or the test fails)."""
    r = httpx.post(base + "/v1/chat/completions", timeout=120, json=greedy_chat(messages, n))
    assert r.status_code == 200, r.text
    return r.json()


def ids(reply: dict[str, Any]) -> list[int]:
    """The token ids of a turn's JSON answer."""
    return [e["id"] for e in reply["choices"][0]["logprobs"]["content"]]


def cold(engine: Engine, messages: list, n: int = 6) -> list[int]:
    """The token ids ``engine`` answers the same turn with (give it no prefix cache)."""
    return token_ids(engine_reply(engine, greedy_chat(messages, n)))


def next_turn(messages: list, reply: dict[str, Any] | str, question: str = "And then?") -> list:
    """The conversation after ``reply`` (a turn's JSON answer, or its text), then
    ``question``."""
    text = reply if isinstance(reply, str) else reply["choices"][0]["message"]["content"]
    return messages + [{"role": "assistant", "content": text},
                       {"role": "user", "content": question}]
