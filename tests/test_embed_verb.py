"""``mlxbun embed`` through a real subprocess on a tiny Qwen3-Embedding checkpoint: the
vectors equal what ``POST /v1/embeddings`` answers for the same texts (plain and with an
instruction), stdin gives one vector per line, ``--json`` is the OpenAI list shape."""

import json
import os
import subprocess
import sys

import httpx
import pytest

from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint
from mlxbun_core.testing.server import start_server

CLI = [sys.executable, "-m", "mlxbun_core.cli"]
TEXTS = ["the cat sat on the mat", "tax law ü 東京"]
INSTR = "Given a web search query, retrieve relevant passages that answer the query"


def mlxbun(*args, stdin=""):
    return subprocess.run([*CLI, *args], input=stdin, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "MLXBUN_LOG_LEVEL": "warning"})


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3", folder="Qwen3-Embedding-tiny", seed=11)


@pytest.fixture(scope="module")
def served(ckpt):
    srv = start_server(ckpt, options=LoadOptions(embedding=True))

    def vectors(texts, instruction=None):
        body = {"input": texts, "encoding_format": "float"}
        if instruction:
            body["instruction"] = instruction
        r = httpx.post(srv.v1 + "/embeddings", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()

    yield vectors
    srv.stop()


def test_stdin_lines_equal_the_server(ckpt, served):
    r = mlxbun("embed", str(ckpt), stdin="\n".join(TEXTS) + "\n")
    assert r.returncode == 0, r.stderr
    ours = [json.loads(line) for line in r.stdout.splitlines()]
    assert ours == [d["embedding"] for d in served(TEXTS)["data"]]


def test_text_instruct_and_json_equal_the_server(ckpt, served):
    r = mlxbun("embed", "--model", str(ckpt), "--text", TEXTS[0], "--instruct", INSTR, "--json")
    assert r.returncode == 0, r.stderr
    out, ref = json.loads(r.stdout), served([TEXTS[0]], INSTR)
    used = ref["usage"]["prompt_tokens"]
    assert out["object"] == "list"
    assert out["usage"] == {"prompt_tokens": used, "total_tokens": used}
    assert [d["embedding"] for d in out["data"]] == [d["embedding"] for d in ref["data"]]
    plain = mlxbun("embed", str(ckpt), TEXTS[0])
    assert plain.returncode == 0 and json.loads(plain.stdout) != out["data"][0]["embedding"]


def test_nothing_to_embed_exits_2(ckpt):
    r = mlxbun("embed", str(ckpt))
    assert r.returncode == 2 and "nothing to embed" in r.stderr
