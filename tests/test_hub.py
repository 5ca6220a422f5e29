"""Hub search, downloads, pushes, settings and dataset builds against a real server,
with a local fake of the hub's HTTP API (the one boundary tests may fake): real
``huggingface_hub`` on the client side, real job subprocesses, real files."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from pathlib import Path

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.fake_hub import (
    FakeHub,
    hub_environment,
    padding_safetensors,
    repo_from_dir,
    silent_hub,
)
from mlxbun_core.testing.server import free_port, start_server

TOKEN = "hf_testtoken_0123456789"
PAD_BYTES = 3 << 20


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("hubenv")
    ckpt = tiny_checkpoint("qwen3", seed=31)
    big = repo_from_dir(ckpt, downloads=50)
    big.files["padding.safetensors"] = padding_safetensors(PAD_BYTES)
    repos = {"acme/Tiny-Big-4bit": big,
             "acme/Tiny-Small-mlx": repo_from_dir(ckpt, downloads=900),
             "acme/Tiny-Gated": repo_from_dir(ckpt, gated=True),
             "acme/Tiny-Torch": repo_from_dir(ckpt, tags=["pytorch"], downloads=5000),
             "acme/Tiny-Second": repo_from_dir(tiny_checkpoint("llama", seed=32))}
    flaky = repo_from_dir(ckpt)
    flaky.files["padding.safetensors"] = padding_safetensors(PAD_BYTES - 4096)
    repos["acme/Tiny-Flaky"] = flaky
    stale = repo_from_dir(ckpt)
    stale.files["padding.safetensors"] = padding_safetensors(1 << 20)
    repos["acme/Tiny-Stale"] = stale
    with FakeHub(repos, tokens=(TOKEN,)) as hub, hub_environment(root, hub):
        # every interface, so a test can call it from a non-loopback address too
        server = start_server(ckpt, max_tokens=4, sessions_dir=root / "sessions", host="0.0.0.0")
        yield {"hub": hub, "server": server, "root": root, "base": server.base_url}
        server.stop()


def api(env, method: str, path: str, **kw) -> httpx.Response:
    return httpx.request(method, env["base"] + path, timeout=30, **kw)


def wait_job(env, job_id: str, timeout: float = 60) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = api(env, "GET", f"/api/jobs/{job_id}").json()["job"]
        if row["status"] in ("done", "failed", "zombie"):
            return row
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not finish: {row}")


def local_ids(env) -> list[str]:
    return [m["repo_id"] for m in api(env, "GET", "/api/hub/local?refresh=1").json()["models"]]


# -- search ------------------------------------------------------------------------------
def test_search_lists_mlx_ready_repos_only(env):
    r = api(env, "GET", "/api/hub/search", params={"q": "tiny"})
    assert r.status_code == 200
    body = r.json()
    ids = [row["id"] for row in body["results"]]
    assert body["offline"] is False
    assert "acme/Tiny-Torch" not in ids  # no mlx tag: not MLX-ready
    assert ids[:2] == ["acme/Tiny-Small-mlx", "acme/Tiny-Big-4bit"]  # by downloads
    assert all(row["size_estimate"] is None for row in body["results"])
    assert api(env, "GET", "/api/hub/search").status_code == 400


def test_search_offline_is_an_answer_not_a_500(env, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    body = api(env, "GET", "/api/hub/search", params={"q": "tiny"}).json()
    assert body["offline"] is True and body["results"] == []
    assert "offline" in body["error"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert api(env, "GET", "/api/hub/search", params={"q": "x"}).json()["offline"] is True


# -- downloads ---------------------------------------------------------------------------
def test_download_cancel_leaves_no_half_model_and_resumes(env):
    hub, repo = env["hub"], "acme/Tiny-Big-4bit"
    hub.throttle_s = 0.05  # ~1.3 MB/s: time to cancel midway
    r = api(env, "POST", "/api/hub/download", json={"repo": repo})
    assert r.status_code == 200 and r.json()["started"] is True
    job_id = r.json()["job_id"]
    again = api(env, "POST", "/api/hub/download", json={"repo": repo})
    assert again.status_code == 409 and "already in progress" in again.json()["error"]
    deadline = time.time() + 30
    while True:
        rows = api(env, "GET", "/downloads").json()["downloads"]
        row = next(d for d in rows if d["job_id"] == job_id)
        if row["current_file"] == "padding.safetensors" and row["received_bytes"] > row[
                "total_bytes"] - PAD_BYTES:  # some of the big file is on disk
            break
        assert time.time() < deadline, rows
        time.sleep(0.05)
    assert row["state"] == "active" and row["total_bytes"] > PAD_BYTES
    assert repo not in local_ids(env)  # in flight: not listed
    assert api(env, "POST", f"/api/jobs/{job_id}/cancel").json()["cancelled"] is True
    failed = wait_job(env, job_id)
    assert failed["status"] == "failed" and "cancelled" in failed["error"]
    assert repo not in local_ids(env)
    repo_dir = env["root"] / "hf" / "hub" / "models--acme--Tiny-Big-4bit"
    assert not (repo_dir / "snapshots").exists() or not any((repo_dir / "snapshots").iterdir())
    partial = [b for b in (repo_dir / "blobs").iterdir() if b.name.endswith(".incomplete")]
    assert partial and partial[0].stat().st_size > 0
    kept = partial[0].stat().st_size
    assert api(env, "GET", "/downloads").json()["downloads"][0]["state"] == "error"

    hub.throttle_s = 0.0
    job2 = api(env, "POST", "/api/hub/download", json={"repo": repo}).json()["job_id"]
    done = wait_job(env, job2)
    assert done["status"] == "done", done
    assert f"bytes={kept}-" in hub.ranges()  # resumed where the cancel left it
    snap = Path(done["output_path"])
    assert (snap / "padding.safetensors").read_bytes() == hub.repos[repo].files[
        "padding.safetensors"]
    assert repo in local_ids(env)
    events = [json.loads(line[6:]) for line in httpx.get(
        f"{env['base']}/api/jobs/{job2}/stream", timeout=30).text.splitlines()
              if line.startswith("data: {\"type")]
    assert any(e["type"] == "stage" and e.get("received_bytes") for e in events)
    assert events[-1]["type"] == "done"


def test_dropped_connections_resume_where_they_stopped(env):
    hub, repo = env["hub"], "acme/Tiny-Flaky"
    hub.cut_after = 1 << 20  # every response ends after 1 MiB of its body
    try:
        row = wait_job(env, api(env, "POST", "/api/hub/download",
                                json={"repo": repo}).json()["job_id"])
    finally:
        hub.cut_after = None
    assert row["status"] == "done", row["error"]
    assert {"bytes=1048576-", "bytes=2097152-"} <= set(hub.ranges())
    snap = Path(row["output_path"])
    assert (snap / "padding.safetensors").read_bytes() == hub.repos[repo].files[
        "padding.safetensors"]


def test_a_resumed_blob_that_fails_its_etag_check_fails_the_download(env):
    """A partial blob that is no prefix of the file (left by another revision, or
    damaged): the resumed whole fails its sha256, the job fails and nothing is kept; the
    next download starts over and succeeds."""
    hub, repo = env["hub"], "acme/Tiny-Stale"
    content = hub.repos[repo].files["padding.safetensors"]
    etag = hashlib.sha256(content).hexdigest()
    blobs = env["root"] / "hf" / "hub" / "models--acme--Tiny-Stale" / "blobs"
    blobs.mkdir(parents=True)
    part = blobs / f"{etag}.incomplete"
    part.write_bytes(bytes(len(content) // 2))  # zeros: not this file's first half
    failed = wait_job(env, api(env, "POST", "/api/hub/download",
                               json={"repo": repo}).json()["job_id"])
    assert f"bytes={len(content) // 2}-" in hub.ranges()  # it did resume
    assert failed["status"] == "failed", failed
    assert "padding.safetensors failed verification" in failed["error"]
    assert not part.exists() and not (blobs / etag).exists()
    assert repo not in local_ids(env)
    done = wait_job(env, api(env, "POST", "/api/hub/download",
                             json={"repo": repo}).json()["job_id"])
    assert done["status"] == "done", done["error"]
    assert (Path(done["output_path"]) / "padding.safetensors").read_bytes() == content
    assert repo in local_ids(env)


def test_download_of_an_unknown_repo_says_404(env):
    job = api(env, "POST", "/api/hub/download", json={"repo": "acme/No-Such"}).json()["job_id"]
    row = wait_job(env, job)
    assert row["status"] == "failed" and "not found on the hub (404)" in row["error"]
    assert api(env, "POST", "/api/hub/download", json={"repo": "../etc"}).status_code == 400


def test_gated_repo_needs_a_token(env):
    repo = "acme/Tiny-Gated"
    row = wait_job(env, api(env, "POST", "/api/hub/download", json={"repo": repo}).json()["job_id"])
    assert row["status"] == "failed" and "gated (401)" in row["error"]
    assert repo not in local_ids(env)
    try:
        assert api(env, "POST", "/api/settings/hf-token", json={"token": TOKEN}).json()["ok"]
        row = wait_job(env, api(env, "POST", "/api/hub/download",
                                json={"repo": repo}).json()["job_id"])
        assert row["status"] == "done", row
        assert repo in local_ids(env)
    finally:
        api(env, "DELETE", "/api/settings/hf-token")


# -- settings ----------------------------------------------------------------------------
def test_token_is_stored_for_huggingface_hub_and_never_echoed(env):
    assert api(env, "GET", "/api/settings/hf-token").json()["hasToken"] is False
    r = api(env, "POST", "/api/settings/hf-token", json={"token": TOKEN})
    assert TOKEN not in r.text
    path = env["root"] / "hf" / "token"
    assert path.read_text() == TOKEN
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    got = api(env, "GET", "/api/settings/hf-token")
    assert got.json()["hasToken"] is True and TOKEN not in got.text
    assert got.json()["masked"].endswith(TOKEN[-4:])
    assert api(env, "POST", "/api/settings/hf-token", json={"token": ""}).status_code == 400
    assert api(env, "DELETE", "/api/settings/hf-token").json()["hasToken"] is False
    assert not path.exists()


def test_tool_approvals_list_and_revoke(env):
    from mlxbun_core.hub import settings

    assert api(env, "GET", "/api/settings/tool-approvals").json()["alwaysAllow"] == []
    settings.grant("bash")
    settings.grant("edit")
    try:
        assert api(env, "GET", "/api/settings/tool-approvals").json()["alwaysAllow"] == [
            "bash", "edit"]
        r = api(env, "DELETE", "/api/settings/tool-approvals", json={"tool": "bash"})
        assert r.json() == {"ok": True, "alwaysAllow": ["edit"]}
        again = api(env, "DELETE", "/api/settings/tool-approvals", json={"tool": "bash"})
        assert again.json()["alwaysAllow"] == ["edit"]  # idempotent
        missing = api(env, "DELETE", "/api/settings/tool-approvals")
        assert missing.status_code == 400 and missing.json()["error"] == "tool required"
        assert api(env, "POST", "/api/settings/tool-approvals",
                   json={"tool": "x"}).status_code == 405
    finally:  # the approvals live in the session's home: later tests expect none
        settings.revoke("bash")
        settings.revoke("edit")


# -- push --------------------------------------------------------------------------------
def test_push_uploads_a_folder_with_a_card(env, tmp_path):
    src = tmp_path / "out"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "qwen3", "quantization": {
        "bits": 4, "group_size": 64}}))
    (src / "model.safetensors").write_bytes(padding_safetensors(1024))
    no_token = api(env, "POST", "/api/quantize/push", json={"repo_id": "tester/q4",
                                                             "source_path": str(src)})
    assert no_token.status_code == 400 and "token" in no_token.json()["error"]
    api(env, "POST", "/api/settings/hf-token", json={"token": TOKEN})
    try:
        r = api(env, "POST", "/api/quantize/push", json={"repo_id": "tester/q4",
                                                          "source_path": str(src)})
        assert r.status_code == 200 and r.json()["url"].endswith("/tester/q4")
        row = wait_job(env, r.json()["job_id"])
        assert row["status"] == "done", row["error"]
        files = env["hub"].repos["tester/q4"].files
        assert files["model.safetensors"] == (src / "model.safetensors").read_bytes()
        assert "4-bit" in files["README.md"].decode() and "mlxbun serve tester/q4" in files[
            "README.md"].decode()
    finally:
        api(env, "DELETE", "/api/settings/hf-token")


# -- datasets ----------------------------------------------------------------------------
def test_dataset_from_chat_sessions_and_jsonl(env, tmp_path):
    templates = api(env, "GET", "/api/dataset/templates").json()["templates"]
    assert {t["id"] for t in templates} >= {"chat-sessions", "jsonl-import"}
    sessions = env["root"] / "sessions"
    sessions.mkdir(exist_ok=True)
    for i in range(4):
        lines = [{"type": "session", "version": 1},
                 {"type": "message", "id": f"u{i}", "parentId": None,
                  "message": {"role": "user", "content": f"question {i}"}},
                 {"type": "message", "id": f"a{i}", "parentId": f"u{i}",
                  "message": {"role": "assistant", "content": f"answer {i}"}}]
        (sessions / f"s{i}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    r = api(env, "POST", "/api/dataset/submit", json={"template_id": "chat-sessions",
                                                       "inputs": {"valid_fraction": 0.25}})
    assert r.status_code == 200
    row = wait_job(env, r.json()["job_id"])
    assert row["status"] == "done", row
    out = Path(r.json()["output_dir"])
    train = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    valid = [json.loads(x) for x in (out / "valid.jsonl").read_text().splitlines()]
    assert len(train) == 3 and len(valid) == 1
    assert train[0]["messages"][0]["role"] == "user"
    assert train[0]["messages"][-1]["content"].startswith("answer")

    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join([json.dumps({"prompt": "p", "completion": "c"})] * 5
                             + ["not json", json.dumps({"prompt": 3})]) + "\n")
    r = api(env, "POST", "/api/dataset/submit", json={"template_id": "jsonl-import",
                                                       "inputs": {"path": str(src)}})
    row = wait_job(env, r.json()["job_id"])
    assert row["status"] == "done"
    out = Path(r.json()["output_dir"])
    assert len((out / "train.jsonl").read_text().splitlines()) == 4
    unknown = api(env, "POST", "/api/dataset/submit", json={"template_id": "nope"})
    assert unknown.status_code == 400 and "unknown template" in unknown.json()["error"]


# -- serve, delete, resolve-folder -----------------------------------------------------------
def test_serve_delete_and_resolve_folder(env):
    repo = "acme/Tiny-Second"
    row = wait_job(env, api(env, "POST", "/api/hub/download", json={"repo": repo}).json()["job_id"])
    assert row["status"] == "done", row
    served = api(env, "POST", "/api/hub/serve", json={"model": repo}).json()
    assert served == {"ok": False, "restart_required": True, "command": f"mlxbun serve {repo}"}
    found = api(env, "POST", "/api/model/resolve-folder",
                json={"folder_name": "models--acme--Tiny-Second"}).json()
    assert found["ok"] and found["repo_id"] == repo and found["path"] == row["output_path"]
    assert found["model_type"] == "llama"
    nowhere = api(env, "POST", "/api/quantize/resolve-folder", json={"folder_name": "../etc"})
    assert nowhere.json()["ok"] is False
    gone = api(env, "POST", "/api/hub/delete", json={"repo": repo})
    assert gone.status_code == 200, gone.text
    assert repo not in local_ids(env)
    assert not (env["root"] / "hf" / "hub" / "models--acme--Tiny-Second").exists()


# -- offline and the CLI -------------------------------------------------------------------
def test_offline_download_says_so_and_cached_models_stay_listed(env, monkeypatch):
    before = local_ids(env)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    row = wait_job(env, api(env, "POST", "/api/hub/download",
                            json={"repo": "acme/Tiny-Small-mlx"}).json()["job_id"])
    assert row["status"] == "failed" and row["error"].startswith("offline: the hub")
    assert local_ids(env) == before
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    body = api(env, "GET", "/api/hub/local?refresh=1").json()
    assert body["offline"] is True and [m["repo_id"] for m in body["models"]] == before


def test_cli_download_shows_a_bar_and_ls_lists_every_revision(env):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "mlxbun_core.cli"]
    run = subprocess.run(cmd + ["download", "acme/Tiny-Small-mlx"], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "acme/Tiny-Small-mlx downloaded" in run.stdout
    assert "acme/Tiny-Small-mlx:" in run.stderr and "100%" in run.stderr  # the tqdm bar
    missing = subprocess.run(cmd + ["download", "acme/Nope"], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "not found on the hub (404)" in missing.stderr
    ls = subprocess.run(cmd + ["ls", "--all-revisions", "Tiny-Small", "--json"],
                        capture_output=True, text=True, timeout=120)
    rows = [json.loads(line) for line in ls.stdout.splitlines()]
    assert [(r["repo_id"], r["canonical"], r["refs"]) for r in rows] == [
        ("acme/Tiny-Small-mlx", True, ["main"])]
    assert "acme/Tiny-Small-mlx" in local_ids(env)


def test_cli_download_from_a_hub_that_never_answers_ends_with_a_message(tmp_path):
    """The hub accepts the connection and says nothing: the download ends within the
    deadline (MLXBUN_HUB_TIMEOUT, 2 s here) and says why."""
    import subprocess
    import sys

    with silent_hub() as url:
        env = {**os.environ, "HF_ENDPOINT": url, "MLXBUN_HUB_TIMEOUT": "2",
               "HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}
        env.pop("HF_HUB_OFFLINE", None)
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "mlxbun_core.cli", "download",
                              "acme/Tiny-Small-mlx"], capture_output=True, text=True,
                             timeout=120, env=env)
        took = time.monotonic() - started
    assert run.returncode == 2, run.stderr
    assert f"the hub {url} did not answer within 2 s" in run.stderr, run.stderr
    assert took < 60, took  # the deadline, job start-up and one retry at most


def test_cli_upload_pushes_a_dataset_with_a_card(env, tmp_path):
    import subprocess
    import sys

    src = tmp_path / "data"
    src.mkdir()
    (src / "train.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    cmd = [sys.executable, "-m", "mlxbun_core.cli", "upload", "--path", str(src),
           "--upload-repo", "tester/set", "--dataset"]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "no hub token" in refused.stderr
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_TOKEN": TOKEN})
    assert run.returncode == 0, run.stderr
    repo = env["hub"].repos["tester/set"]
    assert repo.kind == "dataset"
    assert repo.files["train.jsonl"] == (src / "train.jsonl").read_bytes()
    assert "`train.jsonl`: 2 rows" in repo.files["README.md"].decode()


def test_admin_routes_refuse_remote_clients(env):
    from tests.test_guard import outward_ip

    remote = f"http://{outward_ip()}:{env['server'].port}"
    for method, route, body in (
            ("POST", "/api/hub/download", {"repo": "acme/Tiny-Small-mlx"}),
            ("GET", "/api/hub/search?q=tiny", None), ("GET", "/api/gc/plan", None),
            ("POST", "/api/gc/execute", {"yes": True}),
            ("POST", "/api/settings/hf-token", {"token": TOKEN}),
            ("DELETE", "/api/settings/tool-approvals", {"tool": "bash"}),
            ("POST", "/api/dataset/submit", {"template_id": "chat-sessions"}),
            ("POST", "/api/quantize/push", {"repo_id": "tester/x", "source_path": "/"}),
            ("POST", "/api/hub/delete", {"repo": "acme/Tiny-Small-mlx"}),
            ("POST", "/api/model/resolve-folder", {"folder_name": "x"})):
        r = httpx.request(method, remote + route, json=body, timeout=30)
        assert r.status_code == 403, route
    assert api(env, "GET", "/api/settings/hf-token").json()["hasToken"] is False


FUZZED = {  # bodies that, mutated, must never get a 5xx or start real work
    "/api/hub/serve": [{"model": "acme/Tiny-Big-4bit"}],
    "/api/hub/delete": [{"repo": "acme/Not-Here"}],
    "/api/model/resolve-folder": [{"folder_name": "models--acme--X", "rel_path": "a/b"}],
    "/api/dataset/submit": [{"template_id": "nope", "inputs": {"valid_fraction": 0.1}}],
    "/api/quantize/push": [{"repo_id": "tester/fz", "source_path": "/nonexistent/mlxbun-fz"}],
    "/api/dataset/push": [{"repo_id": "tester/fz", "job_id": "nope"}],
    "/api/gc/execute": [{"plan_id": "0000000000000000", "items": ["x"]}],
    "/api/settings/hf-token": [{"token": "hf_fuzz"}],  # last: it may save a token
}


def fuzz_route(client: httpx.Client, route: str) -> None:
    from hypothesis import HealthCheck, given, settings

    from mlxbun_core.testing import fuzz

    @settings(max_examples=20, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(sent=fuzz.encoded(route, FUZZED))
    def one(sent):
        r = client.post(route, content=sent, headers={"content-type": "application/json"})
        where = f"{route} {r.status_code} for {sent[:200]!r}: {r.text[:200]}"
        assert r.status_code < 500, where
        if r.status_code >= 400:
            body = r.json()
            assert r.status_code in (400, 404, 409, 413), where
            assert body["ok"] is False and isinstance(body["error"], str), where

    one()


def test_no_hub_admin_body_gets_a_5xx(env):
    jobs_before = len(api(env, "GET", "/api/jobs?limit=500").json()["jobs"])
    try:
        with httpx.Client(base_url=env["base"], timeout=30) as client:
            for route in FUZZED:
                fuzz_route(client, route)
    finally:
        api(env, "DELETE", "/api/settings/hf-token")
    assert len(api(env, "GET", "/api/jobs?limit=500").json()["jobs"]) == jobs_before
