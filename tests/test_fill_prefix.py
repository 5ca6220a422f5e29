"""Forced-token fill with the prefix cache on: every entry a lane publishes holds exactly
as many KV positions as its key has tokens (a forced run recorded twice once published
253 tokens over 148 positions), and a follow-up turn that hits those entries answers as
a cold engine does. Written against the engine's public face (``Engine.start``, the
prefix cache's ``store`` and ``stats``), not the lanes' insides."""

from __future__ import annotations

import asyncio

import pytest

from mlxbun_core.engine.batch.entry import BlockEntry
from mlxbun_core.engine.core import Engine
from mlxbun_core.engine.reply import gather
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import close
from mlxbun_core.testing.helpers import configure

FIELDS = {f"field_{i}": ({"type": "integer", "minimum": 0, "maximum": 9} if i % 2 else
                         {"enum": ["red", "green", "blue"]}) for i in range(8)}
SCHEMA = {"type": "object", "properties": FIELDS, "required": list(FIELDS),
          "additionalProperties": False}
WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                     "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}}


def record(ask: str) -> list:
    return [{"role": "system", "content": "You fill in records. " * 6},
            {"role": "user", "content": ask}]


def json_body(messages: list) -> dict:
    return {"messages": messages, "max_tokens": 120, "temperature": 0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "record", "schema": SCHEMA}}}


def tool_body(messages: list) -> dict:
    return {"messages": messages, "max_tokens": 60, "temperature": 0,
            "tools": [{"type": "function", "function": WEATHER}],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}


def run(engine: Engine, bodies: list) -> list:
    """Start ``bodies`` together (one batch); the replies."""
    async def go():
        gens = [await engine.start(engine.parse_chat(b)) for b in bodies]

        async def collect(gen):
            return gather([ev async for ev in gen.events()])
        return await asyncio.gather(*[collect(g) for g in gens])

    return asyncio.run(go())


def answer(reply) -> tuple:
    """What a greedy reply said (fill refuses logprobs: the text is compared)."""
    return (reply.content, [(c.name, c.arguments) for c in reply.tool_calls],
            reply.finish.usage.completion_tokens, reply.finish.reason)


def follow_up(body: dict, reply) -> dict:
    messages = body["messages"] + [{"role": "assistant", "content": reply.content or "{}"},
                                   {"role": "user", "content": "Another one, please."}]
    return {**body, "messages": messages}


@pytest.mark.parametrize("batch", [8, 1], ids=["batched", "serial"])
def test_published_entries_hold_their_tokens_and_hits_answer_as_cold(batch, monkeypatch):
    configure(monkeypatch, engine={"fill_batch_tokens": 512})  # runs ride in batch steps (a GPU's)
    path = str(tiny_checkpoint("llama", seed=3))
    warm = Engine.load(path, progress=False, batch=batch, fill="strict")
    cold = Engine.load(path, progress=False, batch=batch, fill="strict", prompt_cache_bytes=0)
    published: list[tuple[int, list[int]]] = []  # (key tokens, KV positions of each layer)
    store = warm.prefix.store

    def spy(namespace, tokens, cache, **kw):
        # mlx-lm caches say their positions per layer; the batch's block entries, once
        published.append((len(tokens), [cache.length] if isinstance(cache, BlockEntry)
                          else [c.offset for c in cache]))
        return store(namespace, tokens, cache, **kw)

    monkeypatch.setattr(warm.prefix, "store", spy)
    try:
        first = [json_body(record("A record about the sea.")),
                 json_body(record("A record about the sky, in detail.")),
                 tool_body(record("Weather in Paris?"))]
        replies = run(warm, first)
        assert all(r.finish.usage.fill is not None for r in replies)  # runs were forced
        assert sum(r.finish.usage.fill_report()["injected"] for r in replies) > 40
        second = [follow_up(b, r) for b, r in zip(first, replies)]
        hits_before = warm.prefix.stats()["hits"]
        again = run(warm, second)
        want = run(cold, second)
    finally:
        close(warm, cold)
    assert published
    for n, offsets in published:
        assert set(offsets) == {n}, f"an entry keyed by {n} tokens holds {offsets[0]} positions"
    assert warm.prefix.stats()["hits"] - hits_before == len(second)
    for got, cold_reply in zip(again, want):
        assert got.finish.usage.cached_tokens > 0
        assert answer(got) == answer(cold_reply)
