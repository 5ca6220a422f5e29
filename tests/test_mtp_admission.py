"""Memory admission bills the MTP head's own KV: a row drafting with the checkpoint's head
(``draft_kind: "mtp"``) reserves its worst-case KV plus the head's cache, a row per token
of that same worst case (the predictor's ``kv_bytes_per_token``), on the batch lane, a
lone stream and the serial lane; a budget that holds two plain rows together makes two
MTP rows of the same size take turns (``memory_waits``).

A real server over the tiny Qwen3.5 checkpoint with a ``"copy"`` head and a budget of
exactly ``CONTEXT`` tokens of target KV (as in test_admission.py).
"""

from __future__ import annotations

import json

import httpx
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core.engine.admission import weight_bytes
from mlxbun_core.library import fit
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import prompt_of, together
from mlxbun_core.testing.server import start_server

CONTEXT = 300
MTP, PLAIN = {"draft_kind": "mtp"}, {"draft_kind": "none"}


@pytest.fixture(scope="module")
def srv():
    path = tiny_checkpoint("qwen3_5", mtp="copy", dtype="float32")
    model, tok = mlx_load(str(path))
    config = json.loads((path / "config.json").read_text())
    budget = (weight_bytes(model) + fit.kv_layout(config).bytes_at(CONTEXT)
              + fit.transient_bytes(config, CONTEXT))
    s = start_server(path, batch=4, memory_budget_bytes=budget)
    s.tok = tok
    # every reservation as it is made: (job, bytes reserved)
    adm, reserve, s.reserved = s.engine.admission, s.engine.admission.reserve, []

    def recorded(job):
        reserve(job)
        s.reserved.append((job, job.reserved_bytes))

    adm.reserve = recorded
    yield s
    adm.reserve = reserve
    s.stop()



def complete(srv, prompt: str, max_tokens: int, extra: dict) -> dict:
    """A greedy completion (no logits processors: an MTP row of them runs serially)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(srv.v1 + "/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()



def admission(srv) -> dict:
    return httpx.get(srv.base_url + "/stats").json()["admission"]


def test_an_mtp_row_reserves_the_heads_kv_on_every_lane(srv):
    head = srv.engine.predictor.kv_bytes_per_token
    assert head > 0 and admission(srv)["mtp_head_kv_bytes_per_token"] == head
    layout, prompt = srv.engine.admission.layout, prompt_of(srv.tok, 12)
    runs = {"plain": PLAIN, "lone mtp": MTP, "serial mtp": {**MTP, "seed": 7}}
    got = {}
    for name, extra in runs.items():
        first = len(srv.reserved)
        out = complete(srv, prompt, 20, extra)
        assert out["usage"]["completion_tokens"] == 20
        ((job, reserved),) = srv.reserved[first:]
        got[name] = (job.session.usage.lane, reserved)
    tokens = 12 + 20
    assert got["plain"] == ("batched", layout.bytes_at(tokens))
    assert got["lone mtp"] == ("batched+spec", layout.bytes_at(tokens) + head * tokens)
    assert got["serial mtp"] == ("serial+spec", layout.bytes_at(tokens) + head * tokens)
    assert admission(srv)["reserved_kv_bytes"] == 0  # all released


def test_two_rows_that_fit_plain_take_turns_with_the_head(srv):
    adm = srv.engine.admission
    head, room, layout = adm.head_bytes_per_token, adm.kv_room, adm.layout
    # the longest rows two of which fit together plainly; one MTP row of them fits alone,
    # two do not
    n = max(t for t in range(1, CONTEXT) if 2 * layout.bytes_at(t) <= room)
    assert layout.bytes_at(n) + head * n <= room < 2 * (layout.bytes_at(n) + head * n)
    prompt, tokens = prompt_of(srv.tok, 10), n - 10

    def pair(extra: dict) -> int:
        before = admission(srv)["memory_waits"]
        outs = together(*[lambda: complete(srv, prompt, tokens, extra)] * 2)
        assert [o["usage"]["completion_tokens"] for o in outs] == [tokens] * 2
        return admission(srv)["memory_waits"] - before

    assert pair(PLAIN) == 0
    assert pair(MTP) >= 1
    assert admission(srv)["reserved_kv_bytes"] == 0
