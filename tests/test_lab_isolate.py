"""The lab's Quantize → Serve under ``serve --isolate --model-pool 2``: a real parent
process, a real engine child, the quantize job in its own process. The result is a model
the parent has never scanned; Serve must start it in the pool (no restart), /v1/models must
say so, and a chat that names it must be answered by it — exactly the calls the Quantize
page makes, at the HTTP level (the page's own rendering of them is covered by
tests/browser/test_lab_pages.py)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time

import httpx
import openai
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.process import ServerProcess
from mlxbun_core.testing.server import free_port

MODEL = "Tiny-Llama"


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab-isolate")
    home = root / "home"
    shutil.copytree(tiny_checkpoint("llama"), home / "models" / MODEL)
    port = free_port()
    env = {**os.environ, "MLXBUN_HOME": str(home), "HF_HOME": str(root / "hf"),
           "HF_HUB_OFFLINE": "1", "MLX_DISABLE_COMPILE": "1"}
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "serve", "--isolate", "--model-pool", "2",
           "--port", str(port), "--model", str(home / "models" / MODEL)]
    with ServerProcess(cmd, env=env) as proc:
        base = f"http://127.0.0.1:{port}"
        proc.wait_for_http(base + "/engine", 60)
        wait(lambda: httpx.get(base + "/engine").json()["state"] == "ready", proc, "the engine")
        yield proc, base


def wait(cond, proc, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.proc.poll() is None, f"the server exited waiting for {what}:\n{proc.output}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{proc.output}"
        time.sleep(0.2)


def job_events(base: str, job_id: str) -> list[dict]:
    """The job's SSE stream (as the page reads it), to its end."""
    events = []
    with httpx.stream("GET", f"{base}/api/jobs/{job_id}/stream", timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
            if line.startswith("event: end"):
                break
    return events


def test_quantize_then_serve_starts_the_result_in_the_pool_and_it_chats(pool):
    proc, base = pool
    # the page's model list comes from the engine child's library
    local = httpx.get(base + "/api/hub/local").json()["models"]
    assert MODEL in [m["repo_id"] for m in local]
    check = httpx.post(base + "/api/quantize/inspect", json={"model_id": MODEL}).json()
    assert check["ok"] is True
    # the parent scans the library now, before the result exists (its cache is warm)
    assert "4bit" not in json.dumps(httpx.get(base + "/v1/models").json())
    r = httpx.post(base + "/api/quantize/submit", json={"model_id": MODEL, "bits": 4,
                                                        "group_size": 64, "mode": "affine"})
    assert r.status_code == 200, r.text
    events = job_events(base, r.json()["job_id"])
    assert events[-1]["type"] == "done", events[-1]
    name = f"{MODEL}-4bit"
    listed = httpx.get(base + "/api/hub/local?refresh=1").json()["models"]
    assert name in [m["repo_id"] for m in listed]

    served = httpx.post(base + "/api/hub/serve", json={"model": name}, timeout=30)
    assert served.status_code == 200
    body = served.json()
    assert body["ok"] is True and body["pool"] is True and body["model"] == name, body
    assert "restart_required" not in body
    wait(lambda: {e["model"]: e["state"] for e in httpx.get(base + "/engine").json()["pool"]
                  ["resident"]}.get(name) == "ready", proc, "the quantized model warm")
    row = next(m for m in httpx.get(base + "/v1/models").json()["data"] if m["id"] == name)
    assert row["state"] == "resident"
    again = httpx.post(base + "/api/hub/serve", json={"model": name}, timeout=30).json()
    assert again["state"] == "ready"

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=60)
    answer = client.chat.completions.create(model=name, max_tokens=4, temperature=0,
                                            messages=[{"role": "user", "content": "Hello"}])
    assert answer.model == name and answer.usage.completion_tokens > 0
