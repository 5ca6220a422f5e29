"""Memory admission against a real server with a small --memory-budget: a prompt that
leaves no room is a 400, a broad max_tokens is clamped, rows that do not fit together
wait their turn, and a full queue is a 429 naming its limit."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from mlxbun_core.library import fit
from mlxbun_core.models.facts import weight_bytes
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import prompt_of
from mlxbun_core.testing.server import start_server

CONTEXT = 300


@pytest.fixture(scope="module")
def srv():
    from mlx_lm import load

    path = tiny_checkpoint("qwen3")
    model, tok = load(str(path))
    import json

    config = json.loads((path / "config.json").read_text())
    layout = fit.kv_layout(config)
    budget = weight_bytes(model) + layout.bytes_at(CONTEXT) + fit.transient_bytes(config, CONTEXT)
    s = start_server(path, memory_budget_bytes=budget)
    s.tok = tok
    yield s
    s.stop()



def no_eos(tok) -> dict:
    return {str(i): -100 for i in tok.eos_token_ids}


def test_stats_report_the_plan(srv):
    adm = httpx.get(srv.base_url + "/stats").json()["admission"]
    assert adm["max_safe_context"] == CONTEXT == adm["enforced_context_tokens"]
    assert adm["budget_source"] == "--memory-budget" and adm["kv_bytes_per_token"] > 0


def test_prompt_leaving_no_room_is_a_400(srv):
    r = httpx.post(srv.v1 + "/completions", json={"prompt": prompt_of(srv.tok, CONTEXT),
                                                  "max_tokens": 2})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "memory_admission" and err["code"] == "context_over_budget"
    assert str(CONTEXT) in err["message"]
    ok = httpx.post(srv.v1 + "/completions", json={"prompt": prompt_of(srv.tok, CONTEXT - 1),
                                                   "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


def test_broad_max_tokens_is_clamped_not_rejected(srv):
    body = {"prompt": prompt_of(srv.tok, 50), "max_tokens": 100000, "logit_bias": no_eos(srv.tok)}
    r = httpx.post(srv.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200
    choice, usage = r.json()["choices"][0], r.json()["usage"]
    assert choice["finish_reason"] == "length" and usage["completion_tokens"] == CONTEXT - 50


def test_rows_that_do_not_fit_together_wait(srv):
    before = httpx.get(srv.base_url + "/stats").json()["admission"]["memory_waits"]
    body = {"prompt": prompt_of(srv.tok, 50), "max_tokens": 200, "logit_bias": no_eos(srv.tok),
            "stream": False}

    async def main():
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(*[c.post(srv.v1 + "/completions", json=body)
                                          for _ in range(3)])

    rs = asyncio.run(main())
    assert [r.status_code for r in rs] == [200, 200, 200]
    assert all(r.json()["usage"]["completion_tokens"] == 200 for r in rs)
    stats = httpx.get(srv.base_url + "/stats").json()
    assert stats["admission"]["memory_waits"] > before
    assert stats["admission"]["reserved_kv_bytes"] == 0 and stats["batch"]["active_rows"] == 0


def test_queue_full_names_the_limit(srv):
    worker = srv.engine.worker
    saved, worker.max_waiting = worker.max_waiting, 0
    try:
        r = httpx.post(srv.v1 + "/completions", json={"prompt": "hi", "max_tokens": 2})
    finally:
        worker.max_waiting = saved
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
    assert "0 waiting requests" in r.json()["error"]["message"]
