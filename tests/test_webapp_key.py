"""The lab and Memory pages' calls under ``--api-key``, against one real server reached over
loopback and through this machine's own non-loopback address. The pages read the job
stream and the synthesis stream with fetch, so the key travels as a header like on every
other call: with it the calls work from anywhere (the quantize job runs, its SSE stream
follows it to the end; a dataset is inspected; the vault is set up, its status read, a
dry-run synthesis streamed), without it (or with a wrong one) each is a 401 in the
OpenAI error shape, loopback included."""

from __future__ import annotations

import json

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import environ
from mlxbun_core.testing.server import start_server
from tests.test_guard import UNAUTHORIZED, outward_ip

KEY = "lab-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    root = tmp_path_factory.mktemp("webapp-key")
    data = root / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps(ROW) + "\n")
    with environ(MLXBUN_HOME=str(root / "home"), MLXBUN_WIKI=str(root / "wiki"),
                 MLX_DISABLE_COMPILE="1"):
        srv = start_server(tiny_checkpoint("llama"), host="0.0.0.0", api_key=KEY,
                           sessions_dir=root / "sessions")
        srv.data = data
        try:
            yield srv
        finally:
            srv.stop()


def page_calls(srv) -> list[tuple[str, str, dict | None]]:
    """What the lab and Memory pages call (method, path, JSON body)."""
    return [("POST", "/api/dataset/inspect", {"path": str(srv.data)}),
            ("GET", "/api/dataset/local", None),
            ("POST", "/api/quantize/inspect", {"model_id": str(srv.engine.model.path)}),
            ("POST", "/api/quantize/submit", {"model_id": str(srv.engine.model.path)}),
            ("GET", "/api/jobs?limit=8&kind=quantize", None),
            ("GET", "/api/jobs/0123456789ab/stream", None),
            ("POST", "/api/jobs/0123456789ab/cancel", None),
            ("POST", "/api/memory/init", {}),
            ("GET", "/api/memory/status", None),
            ("GET", "/v1/memory/synthesize?dry=1", None)]


def sse(r: httpx.Response) -> list:
    """The ``data:`` payloads of an SSE response, JSON-decoded where they are JSON."""
    out = []
    for line in r.iter_lines():
        if line.startswith("data: "):
            out.append(line[6:] if line[6:] == "[DONE]" else json.loads(line[6:]))
        if line.startswith("event: end"):
            break
    return out


def test_without_the_key_every_page_call_is_refused_even_on_loopback(keyed):
    for base in (keyed.base_url, f"http://{outward_ip()}:{keyed.port}"):
        for method, path, body in page_calls(keyed):
            for headers in ({}, {"x-api-key": KEY + "x"}):
                r = httpx.request(method, base + path, json=body, headers=headers, timeout=30)
                assert (r.status_code, r.json()) == (401, UNAUTHORIZED), (base, path, headers)


def test_with_the_key_the_lab_and_memory_calls_work_from_a_remote_client(keyed):
    far = f"http://{outward_ip()}:{keyed.port}"
    client = httpx.Client(base_url=far, headers=AUTH, timeout=60)
    inspected = client.post("/api/dataset/inspect", json={"path": str(keyed.data)})
    assert inspected.status_code == 200 and inspected.json()["ok"] is True
    assert inspected.json()["n_train"] == 1

    model = str(keyed.engine.model.path)
    assert client.post("/api/quantize/inspect", json={"model_id": model}).json()["ok"] is True
    job = client.post("/api/quantize/submit", json={"model_id": model, "bits": 8})
    assert job.status_code == 200, job.text
    with client.stream("GET", f"/api/jobs/{job.json()['job_id']}/stream") as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse(r)
    assert events[0]["type"] in ("queued", "started") and events[-1]["type"] == "done", events
    listed = client.get("/api/jobs", params={"kind": "quantize"}).json()["jobs"]
    assert [j["status"] for j in listed] == ["done"]

    assert client.post("/api/memory/init", json={}).json()["ok"] is True
    status = client.get("/api/memory/status").json()
    assert status["ok"] is True and status["enabled"] is True
    with client.stream("GET", "/v1/memory/synthesize", params={"dry": "1"}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = sse(r)
    assert frames[-1] == "[DONE]" and any(isinstance(f, dict) for f in frames), frames
