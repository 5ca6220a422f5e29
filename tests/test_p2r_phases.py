"""``MLXBUN_P2R_TRACE`` records every phase the reference lists, from the lanes
themselves: where the request was placed, the row's setup, each prefill chunk, the
prompt-boundary snapshot, token zero's forward / head / sample, on a lone stream, the
serial lane and batch rows; tracing changes no token."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import openai
import pytest

from mlxbun_core import runconfig
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import stderr_records
from mlxbun_core.testing.server import start_server

PHASES = {"request.body_parse", "request.prompt_prepare", "completion.total",
          "completion.placement", "engine.admission_wait", "cache.lookup_restore",
          "prefill.total", "prefill.batch_setup", "prefill.chunk", "prefill.kv_maintenance",
          "token_zero.total", "token_zero.forward", "token_zero.head", "token_zero.sample",
          "response.first_write", "response.final_write"}
PROMPT = "a b c " * 30


def records(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("[p2r] ")]


def by_phase(record: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for ev in record["events"]:
        out.setdefault(ev["phase"], []).append(ev)
    return out


def streamed(srv, prompt: str = PROMPT) -> str:
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x")
    chunks = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], max_tokens=4,
        temperature=0, stream=True, stream_options={"include_usage": True})
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def check_token_zero(phases: dict[str, list[dict]]) -> None:
    total = phases["token_zero.total"][0]
    forward, head, sample = (phases[f"token_zero.{p}"][0] for p in ("forward", "head", "sample"))
    assert forward["startMs"] <= head["startMs"] <= sample["startMs"]
    end = total["startMs"] + total["durationMs"]
    assert sample["startMs"] + sample["durationMs"] <= end + 0.01  # within token zero


@pytest.fixture(scope="module")
def hybrid():
    """Recurrent layers (a cache that cannot rewind): its prompt boundary is snapshotted."""
    srv = start_server(tiny_checkpoint("qwen3_5", seed=4, dtype="float32"), batch=4,
                       prompt_cache_bytes=1 << 26)
    yield srv
    srv.stop()


def test_a_lone_stream_records_every_phase_and_tracing_changes_no_token(hybrid, capfd):
    untraced = streamed(hybrid, PROMPT + "x")
    with runconfig.overridden(server={"p2r_trace": True}):
        capfd.readouterr()
        traced = streamed(hybrid, PROMPT + "y")
        again = streamed(hybrid, PROMPT + "x")
        recs = stderr_records(capfd, records, 2)
    assert again == untraced  # the stage evaluations change no value
    assert traced and len(recs) == 2
    phases = by_phase(recs[0])
    assert set(phases) == PHASES, PHASES ^ set(phases)
    assert phases["completion.placement"][0]["attributes"]["lane"] == "batched"
    chunks = sum(ev["attributes"]["tokens"] for ev in phases["prefill.chunk"])
    usage_prompt = phases["prefill.total"][0]["attributes"]["prompt_tokens"]
    cached = phases["cache.lookup_restore"][0]["attributes"]["cached_tokens"]
    assert chunks == usage_prompt - cached - 1  # the last prompt token is token zero's
    check_token_zero(phases)


def test_batch_rows_record_their_chunks_and_token_zero(hybrid, capfd):
    async def together():
        client = openai.AsyncOpenAI(base_url=hybrid.base_url + "/v1", api_key="x")
        return await asyncio.gather(*[client.completions.create(
            model="m", prompt=f"{i} " + PROMPT, max_tokens=4, temperature=0)
            for i in range(3)])

    with runconfig.overridden(server={"p2r_trace": True}):
        capfd.readouterr()
        asyncio.run(together())
        recs = stderr_records(capfd, records, 3)
    assert len(recs) == 3
    batched = 0
    for rec in recs:
        phases = by_phase(rec)
        assert {"prefill.chunk", "prefill.batch_setup", "token_zero.forward"} <= set(phases)
        check_token_zero(phases)
        batched += "rows" in phases["token_zero.forward"][0].get("attributes", {})
    assert batched >= 1  # at least one row's token zero came from a batch step


def test_the_serial_lane_records_its_phases(capfd):
    srv = start_server(tiny_checkpoint("qwen3", seed=4), batch=1)
    try:
        with runconfig.overridden(server={"p2r_trace": True}):
            capfd.readouterr()
            streamed(srv)
            recs = stderr_records(capfd, records, 1)
    finally:
        srv.stop()
    phases = by_phase(recs[0])
    # a cache that can rewind takes no boundary snapshot
    assert set(phases) == PHASES - {"prefill.kv_maintenance"}, PHASES ^ set(phases)
    assert phases["completion.placement"][0]["attributes"]["lane"] == "serial"
    check_token_zero(phases)


def test_an_untraced_stream_passes_its_frames_through_no_extra_layer():
    """Every frame of every stream went through one more async generator when tracing
    was off: host work on the event loop's thread each decode step, 32 times at 32
    streams."""
    from mlxbun_core.server import trace

    async def frames():
        yield b"data: 1\n\n"

    source = frames()
    assert trace.traced(source, trace.OFF, None, 0.0) is source

    async def read_traced():
        record = trace.Trace("/v1/completions", "cmpl-1", None)
        ended = SimpleNamespace(finish=None)  # (a generation that never finished)
        out = [f async for f in trace.traced(frames(), record, ended, 0.0)]
        return out, [ev["phase"] for ev in record.events]

    out, phases = asyncio.run(read_traced())
    assert out == [b"data: 1\n\n"] and "response.first_write" in phases
