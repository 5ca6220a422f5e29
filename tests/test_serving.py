"""Many clients at once: streams with random disconnects leave the server clean, and
SIGTERM lets running streams finish while new requests get a 503, then exits 0."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time

import httpx

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.server import free_port, start_server


def no_eos(tokenizer) -> dict:
    return {str(i): -100 for i in tokenizer.eos_token_ids}


def test_64_streams_with_random_disconnects_end_clean():
    s = start_server(tiny_checkpoint("qwen3"))
    rng = random.Random(5)
    ban = no_eos(s.engine.model.tokenizer)
    statuses, finished = [], []

    async def client(c, i):
        leave_after = rng.choice([None, 1, 3, 8])
        body = {"prompt": f"Story {i}:", "max_tokens": 24, "stream": True, "temperature": 1.0,
                "logit_bias": ban}
        async with c.stream("POST", s.v1 + "/completions", json=body) as r:
            statuses.append(r.status_code)
            n = 0
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    n += 1
                    if line == "data: [DONE]":
                        finished.append(i)
                if leave_after is not None and n >= leave_after:
                    return  # walk away mid-stream

    async def main():
        async with httpx.AsyncClient(timeout=120) as c:
            await asyncio.gather(*[client(c, i) for i in range(64)])

    try:
        asyncio.run(main())
        assert statuses == [200] * 64
        deadline = time.time() + 30
        while time.time() < deadline:
            stats = httpx.get(s.base_url + "/stats").json()
            if stats["batch"]["active_rows"] == 0 and stats["batch"]["waiting"] == 0:
                break
            time.sleep(0.05)
        assert stats["batch"]["active_rows"] == 0 and stats["batch"]["waiting"] == 0
        assert stats["requests"]["completed"] == 64 and len(finished) >= 8
        r = httpx.post(s.v1 + "/completions", json={"prompt": "Hi", "max_tokens": 3})
        assert r.status_code == 200
    finally:
        s.stop()


def test_sigterm_drains_running_streams_then_exits_zero():
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    path = tiny_checkpoint("qwen3")
    ban = no_eos(load_tokenizer(path))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = ServerProcess([sys.executable, "-m", "mlxbun_core.cli", "serve", str(path),
                            "--port", str(port)], env={**os.environ, "MLXBUN_SHUTDOWN_TIMEOUT": "60"})
    proc = server.proc
    with server:
        assert server.wait_for_http(base + "/health", timeout=60).status_code == 200
        results = {}

        async def stream(c, i):
            body = {"prompt": f"Tale {i}", "max_tokens": 200, "stream": True, "logit_bias": ban}
            lines = []
            async with c.stream("POST", base + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        if len(lines) == 2 and i == 0:
                            proc.send_signal(signal.SIGTERM)
            results[i] = lines

        async def late(c):
            await asyncio.sleep(0.5)  # the signal has landed by now
            return await c.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 2})

        async def main():
            async with httpx.AsyncClient(timeout=60) as c:
                *_, refused = await asyncio.gather(*[stream(c, i) for i in range(3)], late(c))
                return refused

        refused = asyncio.run(main())
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        for lines in results.values():
            assert lines[-1] == "data: [DONE]"
            assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=30) == 0, server.output
