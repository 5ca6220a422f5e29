"""``--kv-budget``: the batch rows' aggregate KV against a real server on a tiny model.
Three requests whose worst cases fit two at a time: the third waits for a row to finish,
all three finish with the text each gets alone; a request over the budget on its own is
a 400 in its surface's shape; the flag comes from the command line or ``mlxbun.yaml``."""

from __future__ import annotations

import asyncio
import json
import threading

import anthropic
import httpx
import pytest

from mlxbun_core import cli
from mlxbun_core.config import apply_config
from mlxbun_core.library import fit
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

PROMPT_WORDS = 40
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def srv():
    from mlx_lm import load

    path = tiny_checkpoint("qwen3")
    _, tok = load(str(path))
    layout = fit.kv_layout(json.loads((path / "config.json").read_text()))
    # two rows' worst cases fit, three do not (prompts differ by a token or two)
    row = layout.bytes_at(PROMPT_WORDS + 8 + MAX_TOKENS)
    s = start_server(path, batch=4, kv_budget_bytes=int(2.5 * row))
    s.tok, s.row = tok, row
    yield s
    s.stop()


def body(srv, i: int) -> dict:
    words = " ".join(f"w{(i * 7 + k) % 13}" for k in range(PROMPT_WORDS))
    no_eos = {str(t): -100 for t in srv.tok.eos_token_ids}
    return {"prompt": words, "max_tokens": MAX_TOKENS, "temperature": 0, "logit_bias": no_eos}


def stats(srv) -> dict:
    return httpx.get(srv.base_url + "/stats").json()


def test_the_third_row_waits_and_every_row_matches_its_alone_run(srv):
    alone = []
    for i in range(3):
        r = httpx.post(srv.v1 + "/completions", json=body(srv, i), timeout=120)
        assert r.status_code == 200
        alone.append(r.json()["choices"][0]["text"])
    assert len(set(alone)) == 3  # three different rows
    before = stats(srv)["batch"]
    assert before["kv_budget_bytes"] == int(2.5 * srv.row) and before["kv_bytes"] == 0

    seen: list[tuple[int, int]] = []  # (reserved KV, rows running) while they run
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            b = stats(srv)["batch"]
            seen.append((b["kv_bytes"], b["active_rows"]))

    async def together() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(*[c.post(srv.v1 + "/completions", json=body(srv, i))
                                          for i in range(3)])

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        rs = asyncio.run(together())
    finally:
        done.set()
        watcher.join()
    assert [r.status_code for r in rs] == [200, 200, 200]
    assert [r.json()["choices"][0]["text"] for r in rs] == alone
    after = stats(srv)["batch"]
    assert after["kv_budget_waits"] > before["kv_budget_waits"]  # the third one queued
    assert after["kv_bytes"] == 0 and after["active_rows"] == 0
    assert all(kv <= after["kv_budget_bytes"] for kv, _ in seen)
    assert max(rows for _, rows in seen) <= 2


def test_a_request_over_the_budget_alone_is_a_400_in_each_surface(srv):
    big = {**body(srv, 0), "max_tokens": 4 * MAX_TOKENS}
    r = httpx.post(srv.v1 + "/completions", json=big)
    assert r.status_code == 400
    err = r.json()["error"]
    assert (err["type"], err["code"]) == ("memory_admission", "kv_over_budget")
    assert "--kv-budget" in err["message"] and "smaller max_tokens" in err["message"]

    uncapped = {k: v for k, v in body(srv, 0).items() if k != "max_tokens"}
    r = httpx.post(srv.v1 + "/completions", json=uncapped)
    assert r.status_code == 400 and "no max_tokens was sent" in r.json()["error"]["message"]

    client = anthropic.Anthropic(base_url=srv.base_url, api_key="x")
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="m", max_tokens=4 * MAX_TOKENS,
                               messages=[{"role": "user", "content": big["prompt"]}])
    assert bad.value.body["type"] == "error" and "--kv-budget" in str(bad.value.body)
    # a refused request harms nothing: the next one runs
    assert httpx.post(srv.v1 + "/completions", json=body(srv, 1),
                      timeout=120).status_code == 200


def parsed(*argv: str):
    args = cli.build_parser().parse_args(["serve", *argv])
    apply_config(args, ["serve", *argv], cli.build_serve_parser)
    return args


def test_the_flag_and_the_yaml_key(tmp_path, monkeypatch):
    monkeypatch.setenv("MLXBUN_HOME", str(tmp_path))
    assert parsed().kv_budget is None
    assert parsed("--kv-budget", "1.5").kv_budget == 1.5
    (tmp_path / "mlxbun.yaml").write_text("serve:\n  kv_budget: 2.5\n")
    assert parsed().kv_budget == 2.5
    assert parsed("--kv-budget", "1").kv_budget == 1.0  # the flag wins over the file
    with pytest.raises(SystemExit):
        parsed("--kv-budget", "0")
