"""Many clients at once: streams with random disconnects leave the server clean, a client
leaving a batch frees its row; SIGTERM lets running streams finish while new requests get
a 503, then exits 0; a second SIGINT ends open streams with an error event and exits 130."""

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


def serve_process(**env):
    """``mlxbun serve`` on a tiny checkpoint in a subprocess; (server, base url, ban)."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    path = tiny_checkpoint("qwen3")
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "mlxbun_core.cli", "serve", str(path),
                            "--port", str(port), "--no-open"], env={**os.environ, **env})
    return server, f"http://127.0.0.1:{port}", no_eos(load_tokenizer(path))


async def until_draining(c, base):
    """The shutdown signal has landed: /health says so."""
    while (await c.get(base + "/health")).status_code != 503:
        await asyncio.sleep(0.02)


def test_sigterm_drains_running_streams_then_exits_zero():
    server, base, ban = serve_process(MLXBUN_SHUTDOWN_TIMEOUT="60")
    proc = server.proc
    with server:
        assert server.wait_for_http(base + "/health", timeout=60).status_code == 200
        results = {}

        async def stream(c, i, signalled):
            body = {"prompt": f"Tale {i}", "max_tokens": 200, "stream": True, "logit_bias": ban}
            lines = []
            async with c.stream("POST", base + "/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        lines.append(line)
                        if len(lines) == 2 and i == 0:
                            proc.send_signal(signal.SIGTERM)
                            signalled.set()
            results[i] = lines

        async def late(c, signalled):
            # stream 0 has ~198 tokens to go: the server is draining, not gone
            await signalled.wait()
            await until_draining(c, base)
            return await c.post(base + "/v1/completions", json={"prompt": "x", "max_tokens": 2})

        async def main():
            signalled = asyncio.Event()
            async with httpx.AsyncClient(timeout=60) as c:
                *_, refused = await asyncio.gather(*[stream(c, i, signalled) for i in range(3)],
                                                   late(c, signalled))
                return refused

        refused = asyncio.run(main())
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        for lines in results.values():
            assert lines[-1] == "data: [DONE]"
            assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=30) == 0, server.output


def test_a_second_sigint_ends_open_streams_with_an_error_and_exits_nonzero():
    """Ctrl-C twice during a stream: the client gets an error event (not a cut
    connection), the log gets one line and no traceback, the exit status is 130."""
    server, base, ban = serve_process()
    proc = server.proc
    with server:
        assert server.wait_for_http(base + "/health", timeout=60).status_code == 200

        async def main():
            lines = []
            async with httpx.AsyncClient(timeout=60) as c:
                body = {"prompt": "Tale", "max_tokens": 100_000, "stream": True,
                        "logit_bias": ban}
                async with c.stream("POST", base + "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        lines.append(line)
                        if len(lines) == 2:
                            proc.send_signal(signal.SIGINT)
                            await until_draining(c, base)
                            proc.send_signal(signal.SIGINT)
            return lines

        lines = asyncio.run(main())
        assert proc.wait(timeout=30) == 130, server.output
        last = json.loads(lines[-1][6:])
        assert "second shutdown signal" in last["error"]["message"], lines[-3:]
        out = server.output
        assert "Traceback" not in out and "CancelledError" not in out, out
        assert out.count("second signal") == 1, out


def test_a_client_leaving_a_batch_frees_its_row():
    """Three streams share the batch; one with a budget it would take minutes to spend
    leaves once all three are decoding: its row ends cancelled at once, the others run
    to their length."""
    s = start_server(tiny_checkpoint("qwen3"))
    ban = no_eos(s.engine.model.tokenizer)
    finished, real = [], s.engine._finished
    s.engine._finished = lambda fin, *note: (finished.append(fin), real(fin, *note))
    counts = [0, 0, 0]
    state = {}

    async def client(c, i, budget):
        body = {"prompt": f"Story {i}:", "max_tokens": budget, "stream": True, "logit_bias": ban}
        async with c.stream("POST", s.v1 + "/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    counts[i] += 1
                if i == 1 and min(counts) >= 3:
                    state["alone"] = s.engine.worker.lanes[0].alone
                    return  # walk away mid-stream, in the batch

    async def main():
        async with httpx.AsyncClient(timeout=120) as c:
            await asyncio.gather(client(c, 0, 64), client(c, 1, 100_000), client(c, 2, 64))

    try:
        asyncio.run(main())
        deadline = time.time() + 60
        while len(finished) < 3 and time.time() < deadline:
            time.sleep(0.05)
        assert state["alone"] is False
        reasons = sorted((f.reason, f.usage.completion_tokens) for f in finished)
        assert [r for r, _ in reasons] == ["cancelled", "length", "length"], reasons
        # it left after a few tokens: ended there, not when the batch drained to it
        assert reasons[0][1] < 32 and [n for _, n in reasons[1:]] == [64, 64]
    finally:
        s.stop()
