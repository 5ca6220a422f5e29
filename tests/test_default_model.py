"""The embedded default model (SmolLM2-135M-Instruct, converted from its GGUF) gives real answers."""

import os
import sys

import httpx
import openai
import pytest

from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.server import free_port, start_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def srv(smollm2_path):
    s = start_server(smollm2_path)
    yield s
    s.stop()


def test_capital_of_france_non_stream(srv):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    r = client.chat.completions.create(model="default", messages=QUESTION, temperature=0, max_tokens=16)
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")


def test_capital_of_france_stream(srv):
    client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
    chunks = list(client.chat.completions.create(model="default", messages=QUESTION, temperature=0,
                                                 max_tokens=16, stream=True))
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in chunks)


def test_serve_with_no_model_uses_the_embedded_default(smollm2_path):
    """`mlxbun serve` with no MODEL: the README's run command."""
    port = free_port()
    env = {**os.environ, "MLXBUN_HOME": str(smollm2_path.parent.parent)}
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "serve", "--port", str(port)]
    with ServerProcess(cmd, env=env) as proc:
        banner = proc.wait_for_line("serving", timeout=120)
        assert "SmolLM2-135M-Instruct" in proc.output and "plugin 'generic'" in banner
        proc.wait_for_http(f"http://127.0.0.1:{port}/health", timeout=30)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()
        assert models["data"][0]["id"] == "SmolLM2-135M-Instruct"

