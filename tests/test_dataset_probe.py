"""The lab's dataset routes over real HTTP on a tiny model: POST /api/dataset/inspect
counts rows per split, names the fields, counts tokens with the model's tokenizer and
flags every broken row by line; POST /api/dataset/upload writes a train/valid folder
that GET /api/dataset/local lists and fine-tune takes by library model id; mistakes are
4xx; remote clients are refused."""

from __future__ import annotations

import json
import os

import httpx
import pytest

from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server


def rows(n: int) -> list[str]:
    return [json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                     {"role": "assistant", "content": "an answer"}]})
            for i in range(n)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("probe-home")
    saved = os.environ.get("MLXBUN_HOME")
    os.environ["MLXBUN_HOME"] = str(home)
    srv = start_server(tiny_checkpoint("llama"), host="0.0.0.0")
    srv.home = home
    yield srv
    srv.stop()
    if saved is None:
        os.environ.pop("MLXBUN_HOME", None)
    else:
        os.environ["MLXBUN_HOME"] = saved


def post(server, route, body):
    return httpx.post(server.base_url + route, json=body, timeout=60)


def test_inspect_counts_rows_tokens_and_flags_broken_lines(server, tmp_path):
    (tmp_path / "train.jsonl").write_text("\n".join(
        [*rows(4), "{oops", json.dumps({"prompt": "p"}), json.dumps({"text": "plain"}),
         json.dumps({"messages": "not a list"})]) + "\n\n")
    (tmp_path / "valid.jsonl").write_text("\n".join(rows(2)) + "\n")
    r = post(server, "/api/dataset/inspect", {"path": str(tmp_path), "max_seq_length": 12})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["ok"] and out["format"] == "messages"
    assert out["splits"]["train"]["rows"] == 5 and out["splits"]["train"]["bad_rows"] == 3
    assert (out["n_train"], out["n_valid"]) == (5, 2)
    assert out["fields"] == {"messages": 6, "text": 1}
    problems = {(p["split"], p["line"]): p["message"] for p in out["problems"]}
    assert "not valid JSON" in problems[("train", 5)]
    assert "no known format" in problems[("train", 6)]
    assert problems[("train", 7)] == "a text row among messages rows"
    assert problems[("train", 8)] == "messages must be a non-empty list"
    assert "longer than max_seq_length 12" in problems[("train", 1)]
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(tiny_checkpoint("llama"))
    chats = [len(tok.apply_chat_template(json.loads(r)["messages"], tokenize=True))
             for r in [*rows(4), *rows(2)]]
    want = [*chats, len(tok.encode("plain"))]
    assert out["tokens"] == {"rows": 7, "total": sum(want), "min": min(want), "max": max(want),
                             "mean": round(sum(want) / 7, 1)}
    assert [s["line"] for s in out["samples"]] == [1, 2, 3]

    one_file = post(server, "/api/dataset/inspect", {"path": str(tmp_path / "valid.jsonl"),
                                                     "count_tokens": False}).json()
    assert one_file["n_train"] == 2 and one_file["tokens"] is None
    assert [p["message"] for p in one_file["problems"]] == [
        "no valid.jsonl: training runs without a validation loss"]


def test_inspect_refuses_what_no_trainer_reads(server, tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "?"}) + "\n")
    out = post(server, "/api/dataset/inspect", {"path": str(tmp_path)}).json()
    assert out["ok"] is False and out["error"] == "train.jsonl has no usable rows"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert post(server, "/api/dataset/inspect", {"path": str(empty)}).json()["ok"] is False
    for body in ({"path": str(tmp_path / "missing")}, {}, {"path": 3},
                 {"path": str(tmp_path), "max_seq_length": 0},
                 {"path": str(tmp_path), "model": "no-such-model"}):
        r = post(server, "/api/dataset/inspect", body)
        assert r.status_code == 400 and r.json()["ok"] is False, (body, r.text)


def test_upload_splits_lists_and_trains_by_model_id(server):
    r = post(server, "/api/dataset/upload",
             {"name": "../My set.jsonl", "train": "\n".join(rows(10))})
    assert r.status_code == 200, r.text
    path = r.json()["path"]
    assert r.json()["name"].startswith("upload-My-set-")
    assert path.startswith(str(server.home / "datasets"))
    out = post(server, "/api/dataset/inspect", {"path": path, "count_tokens": False}).json()
    assert (out["n_train"], out["n_valid"]) == (9, 1) and out["problem_count"] == 0
    listed = httpx.get(server.base_url + "/api/dataset/local").json()["datasets"]
    assert [d["path"] for d in listed] == [path] and listed[0]["has_valid"]
    for bad in ({"train": ""}, {"train": 5}, {"train": "x", "valid_fraction": 2},
                {"train": "x", "valid": 3}):
        assert post(server, "/api/dataset/upload", bad).status_code == 400, bad
    # the page's model picker sends a library id; an unknown one is a 400, not a job
    sub = post(server, "/api/finetune/submit", {"model_id": "no-such-model", "data_dir": path})
    assert sub.status_code == 400 and "no-such-model" in sub.json()["error"]


def test_dataset_routes_refuse_remote_clients(server):
    from tests.test_guard import outward_ip

    remote = f"http://{outward_ip()}:{server.port}"
    for method, route in (("POST", "/api/dataset/inspect"), ("POST", "/api/dataset/upload"),
                          ("GET", "/api/dataset/local")):
        assert httpx.request(method, remote + route, json={}).status_code == 403, route
