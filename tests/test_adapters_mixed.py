"""Many adapters in one batch: rows of one batch carry different LoRA sets (different
ranks, different target layers, PEFT and mlx-lm formats, a stack, none), and each row's
greedy output equals the same request run alone with its adapter (and mlx-lm's own
adapter loading). Also: the stacks in admission and /stats, an adapter unmounted under a
running row, sets that cannot mix (expert layers) and mixing turned off, and streaming
through the real server with the openai SDK."""

from __future__ import annotations

import asyncio
import threading
import time
from unittest.mock import PropertyMock, patch

import httpx
import mlx.core as mx
import openai
import pytest

from mlxbun_core.engine.admission import Admission
from mlxbun_core.engine.reply import gather
from mlxbun_core.testing.adapters import write_lora_adapter, write_peft_copy
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.engine import drive_lane, greedy, token_ids
from mlxbun_core.testing.server import start_server

N = 12
PROMPTS = ["Once upon a time", "The sea is", "Tell me about the", "Hello world and",
           "In the beginning", "Numbers: one two", "A quiet morning", "Red, green and"]


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def made(ckpt, tmp_path_factory):
    """a: rank 4 on every linear; b: rank 8 on q_proj and down_proj only; c: PEFT, rank 2,
    scale 0.7, on v_proj and up_proj."""
    root = tmp_path_factory.mktemp("mixed-adapters")
    a = write_lora_adapter(ckpt, root / "a", seed=1)
    b = write_lora_adapter(ckpt, root / "b", seed=2, rank=8,
                           keys=["self_attn.q_proj", "mlp.down_proj"])
    c0 = write_lora_adapter(ckpt, root / "c-mlx", seed=3, rank=2, scale=0.7,
                            keys=["self_attn.v_proj", "mlp.up_proj"])
    return {"a": a, "b": b, "c": write_peft_copy(c0, root / "c"), "c-mlx": c0}


@pytest.fixture(scope="module")
def server(ckpt, made):
    srv = start_server(ckpt, batch=8)
    for id in ("a", "b", "c"):
        r = httpx.post(srv.v1 + "/adapters", json={"id": id, "path": str(made[id])}, timeout=60)
        assert r.status_code == 200, r.text
    yield srv
    srv.stop()


def reference(ckpt, adapter, prompt: str) -> list:
    """mlx-lm's own greedy decode of ``prompt`` with ``adapter_path`` (None: the base)."""
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load

    model, tok = load(str(ckpt), adapter_path=str(adapter) if adapter else None)
    out = []
    for (t, _), _ in zip(generate_step(mx.array(tok.encode(prompt)), model, max_tokens=N),
                         range(N)):
        out.append(t)
        if t in tok.eos_token_ids:
            break
    return out


def sets_seen(record: list):
    """An ``on_step`` for drive_lane: the distinct adapter sets among the lane's rows."""
    def on_step(step, jobs, lane):
        record.append({row.job.adapters.spec for row in lane._rows.values()})
    return on_step


def alone(engine, bodies) -> list:
    return [token_ids(gather(drive_lane(engine, [b], [0])[0])) for b in bodies]


def test_rows_of_different_adapters_share_a_batch_and_equal_each_alone(server, ckpt, made):
    engine = server.engine
    specs = ["a", "none", "b", "c", "a+b", "a", "c", "b"]
    bodies = [greedy(p, N, adapter=s) for p, s in zip(PROMPTS, specs)]
    want = alone(engine, bodies)
    seen: list = []
    got = drive_lane(engine, bodies, [0, 0, 0, 1, 3, 4, 6, 9], on_step=sets_seen(seen))
    assert [token_ids(gather(ev)) for ev in got] == want
    assert max(len(s) for s in seen) >= 4  # a, none, b, c (and a+b) decoded side by side
    # and what mlx-lm computes with each adapter loaded on its own
    for i in (0, 1, 2):
        assert want[i] == reference(ckpt, made[specs[i]] if specs[i] != "none" else None,
                                    PROMPTS[i])
    assert want[3] == reference(ckpt, made["c-mlx"], PROMPTS[3])  # c is c-mlx in PEFT's layout
    stats = engine.batch_stats()["adapters"]
    assert stats["passes"]["mixed"] > 0 and stats["sets_per_pass"]["max"] >= 4


def test_three_adapters_and_none_decode_in_one_batch_from_the_start(server):
    engine = server.engine
    specs = ["a", "b", "c", "none"] * 2
    bodies = [greedy(p, N, adapter=s) for p, s in zip(PROMPTS, specs)]
    want = alone(engine, bodies)
    seen: list = []
    got = drive_lane(engine, bodies, [0] * len(bodies), on_step=sets_seen(seen))
    assert [token_ids(gather(ev)) for ev in got] == want
    assert {"a", "b", "c", "none"} in seen


def test_stacks_are_counted_in_admission_and_stats(server, made):
    """Every stacked layer holds a zero slot plus one slot per adapter, padded to the
    layer's largest rank; admission reserves them beside the mounted factors."""
    from mlxbun_core.engine.job import EventSink, GenerationJob

    engine = server.engine
    drive_lane(engine, [greedy(p, 2, adapter=s) for p, s in zip(PROMPTS, "abc")], [0, 0, 0])
    stats = httpx.get(server.base_url + "/stats").json()
    adapters = stats["batch"]["adapters"]
    factors: dict = {}  # module -> {"lora_a": [...], "lora_b": [...]} over a, b, c
    for name in ("a", "b", "c-mlx"):
        for key, value in mx.load(str(made[name] / "adapters.safetensors")).items():
            module, leaf = key.rsplit(".", 1)
            factors.setdefault(module, {}).setdefault(leaf, []).append(value)
    want = 0
    for parts in factors.values():
        rank = max(a.shape[1] for a in parts["lora_a"])
        d_in, d_out = parts["lora_a"][0].shape[0], parts["lora_b"][0].shape[1]
        want += (1 + 3) * rank * (d_in + d_out) * 4  # zero slot + 3 adapters, float32
    assert adapters["stacked"] == 3 and adapters["stacked_bytes"] == want
    mounted = sum(r["ram_bytes"] for r in httpx.get(server.v1 + "/adapters").json()["adapters"])
    assert adapters["resident_bytes"] == mounted + want
    assert stats["admission"]["adapter_bytes"] == mounted + want

    async def a_job():
        prepared = await engine.prepare(engine.parse_completion(greedy(PROMPTS[0], N)))
        return GenerationJob(prepared.request, engine.model.tokenizer,
                             EventSink(asyncio.get_running_loop()), N)

    job, adm = asyncio.run(a_job()), engine.admission
    room = adm.reserved_bytes + adm.adapter_bytes + adm.row_bytes(job)
    with patch.object(Admission, "kv_room", new_callable=PropertyMock) as kv_room:
        kv_room.return_value = room
        assert adm.fits(job)
        kv_room.return_value = room - 1  # what the adapters hold is what tips it over
        assert not adm.fits(job)


def test_an_adapter_unmounted_under_a_running_row_stays_with_it(server, made):
    engine = server.engine
    specs = ["a", "b", "none"]
    bodies = [greedy(p, N, adapter=s) for p, s in zip(PROMPTS, specs)]
    want = alone(engine, bodies)

    def unmount_b(step, jobs, lane):
        if step == 3:
            engine.adapters.unmount("b")

    got = drive_lane(engine, bodies, [0, 0, 0], on_step=unmount_b)
    assert [token_ids(gather(ev)) for ev in got] == want
    # the next mixed batch restacks without b
    drive_lane(engine, [greedy(PROMPTS[0], 2, adapter="a"), greedy(PROMPTS[1], 2, adapter="c")],
               [0, 0])
    assert engine.batch_stats()["adapters"]["stacked"] == 2
    r = httpx.post(server.v1 + "/adapters", json={"id": "b", "path": str(made["b"])}, timeout=60)
    assert r.status_code == 200


def test_mixing_off_runs_one_set_per_batch(server):
    engine = server.engine
    specs = ["a", "b", "none", "a"]
    bodies = [greedy(p, N, adapter=s) for p, s in zip(PROMPTS, specs)]
    want = alone(engine, bodies)
    seen: list = []
    engine.adapters.mixing = False
    try:
        got = drive_lane(engine, bodies, [0, 0, 0, 0], on_step=sets_seen(seen))
    finally:
        engine.adapters.mixing = True
    assert [token_ids(gather(ev)) for ev in got] == want
    assert max(len(s) for s in seen) == 1


def test_openai_streams_of_different_adapters_batch_together(server):
    specs = ["a", "b", "c", "none", "a+b", "c"]
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)

    def body(i, s):
        return {"model": "m", "prompt": PROMPTS[i], "max_tokens": N, "temperature": 0,
                "extra_body": {"adapter": s}}

    want = [client.completions.create(**body(i, s)).choices[0].text
            for i, s in enumerate(specs)]
    engine = server.engine
    before = engine.batch_stats()["adapters"]["passes"]["mixed"]
    gate = threading.Event()
    engine.worker.post(lambda: gate.wait(30))  # hold the worker until every stream is queued

    async def streams():
        ac = openai.AsyncOpenAI(base_url=server.v1, api_key="x", max_retries=0)

        async def one(i, s):
            text, lane = "", None
            stream = await ac.completions.create(**body(i, s), stream=True,
                                                 stream_options={"include_usage": True})
            async for chunk in stream:
                text += "".join(c.text for c in chunk.choices)
                if chunk.usage is not None:
                    lane = chunk.usage.model_extra["lane"]
            return text, lane

        async def release():
            deadline = time.time() + 30
            while engine.worker.waiting < len(specs) and time.time() < deadline:
                await asyncio.sleep(0.01)
            gate.set()

        *got, _ = await asyncio.gather(*[one(i, s) for i, s in enumerate(specs)], release())
        return got

    got = asyncio.run(streams())
    assert [t for t, _ in got] == want
    assert {lane for _, lane in got} == {"batched"}
    after = httpx.get(server.base_url + "/stats").json()["batch"]["adapters"]
    assert after["passes"]["mixed"] > before and after["sets_per_pass"]["max"] >= 5


def test_expert_lora_sets_keep_their_own_batch(tmp_path):
    """glm_moe_dsa's expert layers route tokens after sorting them, so a set with expert
    LoRA runs one set per batch; a set on its plain linears still mixes with the base."""
    from mlxbun_core.engine.core import Engine

    ckpt = tiny_checkpoint("glm_moe_dsa")
    engine = Engine.load(str(ckpt), progress=False, batch=8, prompt_cache_bytes=0)
    try:
        engine.worker.run_sync(lambda: engine.adapters.mount(
            "e", write_lora_adapter(ckpt, tmp_path / "e")))
        engine.worker.run_sync(lambda: engine.adapters.mount(
            "l", write_lora_adapter(ckpt, tmp_path / "l", seed=4,
                                    keys=["self_attn.o_proj"])))
        mounted = engine.adapters.mounted
        assert not mounted["e"].mixable and mounted["l"].mixable
        specs = ["e", "l", "none", "e", "l"]
        bodies = [greedy(p, 8, adapter=s) for p, s in zip(PROMPTS, specs)]
        want = alone(engine, bodies)
        seen: list = []
        got = drive_lane(engine, bodies, [0] * len(bodies), on_step=sets_seen(seen))
        assert [token_ids(gather(ev)) for ev in got] == want
        assert all(s == {"e"} or "e" not in s for s in seen)
        assert {"l", "none"} in seen
    finally:
        engine.worker.close()


def test_speculative_batch_steps_route_each_row_to_its_adapter(server):
    """Prompt-lookup verify passes run outside the generator's own step; they must route
    rows by their sets too: rows of different adapters speculating together equal each
    request alone (random weights loop on their own output, so lookups land)."""
    engine = server.engine
    n = 48
    code = "def add(a, b):\n    return a + b\n\nclass Foo:\n    pass\n"
    echo = [code * 3 + code[:20], "hello world " * 10, "one two three four " * 4,
            "red green blue " * 6]
    specs = ["a", "b", "none", "c"]
    bodies = [{**greedy(p, n, adapter=s), "draft_kind": "ngram"}
              for p, s in zip(echo, specs)]
    want = alone(engine, bodies)
    before = engine.lookup_stats()["batch_steps"]
    seen: list = []
    got = drive_lane(engine, bodies, [0] * len(bodies), on_step=sets_seen(seen))
    assert [token_ids(gather(ev)) for ev in got] == want
    assert {"a", "b", "c", "none"} in seen
    assert engine.lookup_stats()["batch_steps"] > before  # verify passes ran mixed
