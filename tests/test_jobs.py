"""Fine-tune and quantize jobs end to end: real subprocesses, real SQLite, the SSE
stream over real HTTP, the CLI in the foreground; killed and orphaned jobs end
failed / zombie; admin routes refuse remote clients and wrong keys."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest

from mlxbun_core.jobs.runner import JobManager
from mlxbun_core.jobs.store import JobStore
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.helpers import environ
from mlxbun_core.testing.server import start_server


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("jobs-home")


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("llama")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("dataset")
    rows = [{"messages": [{"role": "user", "content": f"Say the word {i}"},
                          {"role": "assistant", "content": "banana banana banana banana"}]}
            for i in range(8)]
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    return d


@pytest.fixture(scope="module")
def server(home, ckpt):
    # MLX_DISABLE_COMPILE: on the CPU, skip the one-time JIT of the train step
    with environ(MLXBUN_HOME=str(home), MLX_DISABLE_COMPILE="1"):
        srv = start_server(ckpt, host="0.0.0.0")
        yield srv
        srv.stop()


def stream(server, job_id, timeout=240):
    """The job's SSE stream: (raw first line, [events], ended with `event: end`)."""
    events, first, ended = [], None, False
    with httpx.stream("GET", f"{server.base_url}/api/jobs/{job_id}/stream",
                      timeout=timeout) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if first is None:
                first = line
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                if name == "end":
                    ended = True
                else:
                    events.append(json.loads(line[6:]))
                name = None
    return first, events, ended


def post(server, route, body):
    return httpx.post(server.base_url + route, json=body, timeout=60)


def test_finetune_job_streams_metrics_and_its_adapter_mounts(server, ckpt, data, home):
    probe = post(server, "/api/finetune/inspect-dataset", {"path": str(data)}).json()
    assert probe == {"ok": True, "n_train": 8, "n_valid": 2, "format": "messages"}
    assert post(server, "/api/finetune/inspect-dataset",
                {"path": str(ckpt)}).json()["ok"] is False  # no train.jsonl: 200, ok false

    r = post(server, "/api/finetune/submit", {"model_dir": str(ckpt), "data_dir": str(data),
                                              "iters": 5, "learning_rate": 5e-2, "rank": 4,
                                              "steps_per_eval": 5})
    assert r.status_code == 200, r.text
    job_id, adapter = r.json()["job_id"], r.json()["adapter_path"]
    assert adapter.startswith(str(home / "adapters"))
    first, events, ended = stream(server, job_id)
    assert first == "retry: 1500" and ended
    kinds = [e["type"] for e in events]
    assert kinds[0] == "started" and kinds[-1] == "done", [e for e in events if e["type"] != "log"]
    train = [e for e in events if e["type"] == "metric" and e["kind"] == "train"]
    assert [e["step"] for e in train] == [1, 2, 3, 4, 5]
    assert all(e["loss"] > 0 for e in train)
    assert any(e["type"] == "metric" and e["kind"] == "val" for e in events)
    assert events[-1]["output_dir"] == adapter
    row = httpx.get(f"{server.base_url}/api/jobs/{job_id}").json()["job"]
    assert row["status"] == "done" and row["progress"] == 1 and row["ended_at"]
    assert job_id in [j["id"] for j in httpx.get(server.base_url + "/api/jobs?kind=finetune")
                      .json()["jobs"]]

    avail = httpx.get(server.v1 + "/adapters/available").json()["adapters"]
    found = [a for a in avail if a["path"] == adapter]
    assert found and found[0]["compatible"] and not found[0]["mounted"]
    mounted = httpx.post(server.v1 + "/adapters", json={"id": "tuned", "path": adapter})
    assert mounted.status_code == 200
    client = openai.OpenAI(base_url=server.v1, api_key="x", max_retries=0)

    def say(spec):
        reply = client.completions.create(model="m", prompt="Say the word 3", max_tokens=8,
                                          temperature=0, extra_body={"adapter": spec})
        return reply.choices[0].text

    assert say("tuned") != say("none")


def test_finetune_config_errors(server, ckpt, data, tmp_path):
    assert post(server, "/api/finetune/submit", {"model_dir": str(ckpt)}).json() == {
        "ok": False, "error": "model_dir and data_dir required"}
    r = post(server, "/api/finetune/submit", {"model_dir": str(data), "data_dir": str(data)})
    assert r.status_code == 400 and "config.json" in r.json()["error"]
    (tmp_path / "x").write_text("keep me")
    r = post(server, "/api/finetune/submit", {"model_dir": str(ckpt), "data_dir": str(data),
                                              "adapter_path": str(tmp_path)})
    assert r.status_code == 400 and "not empty" in r.json()["error"]
    # a preference method on rows without pairs, a bad knob: the job's failed event, says why
    for extra, why in (({"method": "dpo"}, "dpo needs rows of prompt, chosen and rejected"),
                       ({"method": "orpo", "sft_scope": "all"}, "sft_scope must be one of"),
                       ({"method": "dpo", "dpo_beta": 0}, "dpo_beta must be positive")):
        r = post(server, "/api/finetune/submit", {"model_dir": str(ckpt), "data_dir": str(data),
                                                  **extra})
        _, events, ended = stream(server, r.json()["job_id"])
        assert ended and events[-1]["type"] == "failed" and why in events[-1]["error"], extra


def test_finetune_refuses_what_is_not_built(server, ckpt, data, home):
    """The reference's knobs with nothing behind them: a 400 naming the field and why, no
    job; their off values (a whole config carries them) and weight_decay / rs_lora train."""
    jobs_before = len(httpx.get(server.base_url + "/api/jobs", timeout=30).json()["jobs"])
    base = {"model_dir": str(ckpt), "data_dir": str(data), "iters": 1}
    for field, value, why in (("segment_size", 2, "segmented backward is not built"),
                              ("orpo_flash_ce", True, "flash-CCE"),
                              ("orpo_fused_ce", True, "no fused linear-CE head"),
                              ("orpo_prefix_shared", True, "no shared prompt prefix"),
                              ("orpo_chunk_size", 512, "not token-chunked"),
                              ("lora_plus_ratio", 16, "LoRA+ is not built"),
                              ("rank_scaling", "by_bits", "only 'constant'")):
        r = post(server, "/api/finetune/submit", {**base, field: value})
        assert r.status_code == 400, (field, r.text)
        assert r.json()["error"].startswith(field) and why in r.json()["error"], r.text
    assert len(httpx.get(server.base_url + "/api/jobs", timeout=30).json()["jobs"]) == jobs_before
    off = {"segment_size": 0, "orpo_flash_ce": False, "orpo_fused_ce": False,
           "orpo_prefix_shared": False, "orpo_chunk_size": 0, "lora_plus_ratio": 1,
           "rank_scaling": "constant", "weight_decay": 0.5, "rs_lora": True}
    r = post(server, "/api/finetune/submit", {**base, **off, "rank": 16, "scale": 8})
    assert r.status_code == 200, r.text
    _, events, ended = stream(server, r.json()["job_id"])
    assert ended and events[-1]["type"] == "done", events[-3:]
    with open(os.path.join(r.json()["adapter_path"], "adapter_config.json")) as f:
        config = json.load(f)
    assert config["lora_parameters"]["scale"] == 2.0 and config["weight_decay"] == 0.5
    r = post(server, "/api/finetune/submit", {**base, "weight_decay": -1})  # a bad number
    _, events, ended = stream(server, r.json()["job_id"])
    assert events[-1]["type"] == "failed" and "weight_decay must not be negative" in events[
        -1]["error"]


def test_preference_job_over_http(server, ckpt, tmp_path):
    """DPO through /api/finetune/submit: pairs in, metrics streamed, the margin up."""
    prefs = tmp_path / "prefs"
    prefs.mkdir()
    rows = [{"prompt": f"Pick a fruit {i}", "chosen": "banana banana",
             "rejected": "cherry cherry"} for i in range(6)]
    (prefs / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    probe = post(server, "/api/finetune/inspect-dataset", {"path": str(prefs)}).json()
    assert probe["format"] == "dpo" and probe["n_train"] == 6
    r = post(server, "/api/finetune/submit", {
        "model_dir": str(ckpt), "data_dir": str(prefs), "method": "dpo", "iters": 6,
        "learning_rate": 1e-2, "rank": 4, "dpo_beta": 0.5, "grad_clip_norm": 5.0,
        "dpo_lr_schedule": "constant"})
    assert r.status_code == 200, r.text
    _, events, ended = stream(server, r.json()["job_id"])
    assert ended and events[-1]["type"] == "done", [e for e in events if e["type"] != "log"][-3:]
    train = [e for e in events if e["type"] == "metric" and e["kind"] == "train"]
    assert [e["step"] for e in train] == list(range(1, 7))
    assert all(e["learning_rate"] == pytest.approx(1e-2) for e in train)  # constant schedule
    summary = events[-1]["summary"]
    assert summary["method"] == "dpo" and summary["margin_after"] > summary["margin_before"]


def test_quantize_job_output_serves(server, ckpt, home):
    info = post(server, "/api/quantize/inspect", {"model_id": str(ckpt)}).json()
    assert info["ok"] and info["arch"] == "llama" and info["support"] and info["size_gb"] > 0
    assert post(server, "/api/quantize/inspect", {"model_id": "/no/such"}).json()["ok"] is False
    bad_bits = post(server, "/api/quantize/submit", {"model_id": str(ckpt), "bits": 7})
    assert bad_bits.status_code == 400

    r = post(server, "/api/quantize/submit", {"model_id": str(ckpt), "bits": 4, "group_size": 32})
    assert r.status_code == 200, r.text
    out = r.json()["output_dir"]
    assert out.startswith(str(home / "models"))
    _, events, ended = stream(server, r.json()["job_id"])
    assert ended and events[-1]["type"] == "done", events[-3:]
    assert any(e["type"] == "stage" for e in events)
    with open(os.path.join(out, "config.json")) as f:
        config = json.load(f)
    assert config["quantization"]["bits"] == 4 and config["quantization"]["group_size"] == 32
    again = post(server, "/api/quantize/inspect", {"model_id": out}).json()
    assert again["support"] is False and "already quantized" in again["error"]

    q = start_server(out)
    try:
        c = openai.OpenAI(base_url=q.v1, api_key="x", max_retries=0)
        assert c.completions.create(model="m", prompt="hi", max_tokens=3).usage.completion_tokens
    finally:
        q.stop()


def test_a_killed_job_is_reported_failed(server, ckpt, data):
    r = post(server, "/api/finetune/submit", {"model_dir": str(ckpt), "data_dir": str(data),
                                              "iters": 100000})
    job_id = r.json()["job_id"]
    deadline = time.time() + 120
    while True:
        row = httpx.get(f"{server.base_url}/api/jobs/{job_id}").json()["job"]
        if row["status"] == "running" and row["pid"]:
            break
        assert time.time() < deadline, row
        time.sleep(0.2)
    os.kill(row["pid"], signal.SIGKILL)
    _, events, ended = stream(server, job_id)
    assert ended and events[-1]["type"] == "failed" and "SIGKILL" in events[-1]["error"]
    assert httpx.get(f"{server.base_url}/api/jobs/{job_id}").json()["job"]["status"] == "failed"


def test_jobs_left_by_a_dead_process_become_zombies(tmp_path, server):
    store = JobStore(tmp_path / "jobs.sqlite")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    job_id = store.create("finetune", {"x": 1}, owner_pid=gone.pid)
    store.append(job_id, {"type": "started"})
    mine = store.create("quantize", {})  # owned by this live process: left alone
    JobManager(store, tmp_path)
    assert store.get(job_id)["status"] == "zombie" and store.get(mine)["status"] == "queued"
    assert store.append(job_id, {"type": "done"}) is False  # terminal stays terminal
    first, events, ended = stream(server, "no-such-job")
    assert first == "retry: 1500" and ended and events == [
        {"type": "failed", "error": "job not found", "ts": events[0]["ts"]}]
    assert httpx.get(server.base_url + "/api/jobs/no-such-job").status_code == 404


def test_event_log_is_byte_capped(tmp_path):
    from mlxbun_core.jobs import store as store_mod

    store = JobStore(tmp_path / "jobs.sqlite")
    job_id = store.create("finetune", {})
    line = "x" * 1000
    kept = sum(store.append(job_id, {"type": "log", "line": line}) for _ in range(400))
    assert kept < 400 and kept * 1000 <= store_mod.JOB_LOG_BYTES
    assert store.append(job_id, {"type": "metric", "kind": "train", "step": 1, "loss": 1.0})
    assert store.append(job_id, {"type": "done"})
    events = [e for _, e in store.events(job_id)]
    assert sum(e.get("line", "").startswith("[log capped") for e in events) == 1


def test_only_an_ended_job_is_deleted(tmp_path):
    """JobStore.delete (a dismissed download): a running job stays; an ended one goes with
    its events, and a second delete finds nothing."""
    store = JobStore(tmp_path / "jobs.sqlite")
    job_id = store.create("download", {"repo": "a/b"})
    store.append(job_id, {"type": "started"})
    assert store.delete(job_id) is False and store.get(job_id)["status"] == "running"
    store.append(job_id, {"type": "failed", "error": "gone"})
    assert store.events(job_id) and store.delete(job_id) is True
    assert store.get(job_id) is None and store.events(job_id) == []
    assert store.delete(job_id) is False


def test_admin_routes_refuse_remote_clients_and_wrong_keys(server, ckpt):
    from tests.test_guard import outward_ip

    remote = f"http://{outward_ip()}:{server.port}"
    for method, route in (("POST", "/api/finetune/submit"), ("POST", "/api/quantize/submit"),
                          ("POST", "/api/finetune/merge"), ("GET", "/api/jobs"),
                          ("POST", "/v1/adapters"), ("DELETE", "/v1/adapters/a"),
                          ("GET", "/v1/adapters/available"), ("GET", "/api/jobs/x/stream")):
        assert httpx.request(method, remote + route, json={}).status_code == 403, route
    keyed = start_server(ckpt, host="0.0.0.0", api_key="k")
    try:
        far = f"http://{outward_ip()}:{keyed.port}"
        def status(key):
            auth = {"Authorization": f"Bearer {key}"}
            return httpx.get(far + "/api/jobs", headers=auth).status_code

        assert status("no") == 401
        assert status("k") == 200
    finally:
        keyed.stop()


def test_cli_quantize_and_train_in_the_foreground(ckpt, data, tmp_path):
    env = {**os.environ, "MLXBUN_HOME": str(tmp_path), "MLX_DISABLE_COMPILE": "1"}
    out = tmp_path / "q"
    run = subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "quantize", str(ckpt),
                          "--bits", "8", "--out", str(out)], capture_output=True, text=True,
                         timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads((out / "config.json").read_text())["quantization"]["bits"] == 8
    run = subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "train", str(ckpt), "--data",
                          str(data), "--iters", "3", "--rank", "2"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "3/3" in run.stderr  # the progress bar reached the last step
    adapter = tmp_path / "finetunes" / f"sft-{ckpt.name}"
    assert (adapter / "adapters.safetensors").is_file()
    rows = JobStore(tmp_path / "jobs.sqlite").list()
    assert [r["status"] for r in rows] == ["done", "done"]
