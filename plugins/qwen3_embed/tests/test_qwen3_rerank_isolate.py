"""`serve --isolate --model-pool 2`: a rerank request naming a reranker in the library starts
that engine and is answered by it (the parent routes /v1/rerank by its `model` field, as it
routes generation), while the default chat engine keeps serving."""


import httpx
import pytest
from mlxbun_qwen3_embed import reranker

from mlxbun_core import loader
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import FAMILY_SPECIAL_TOKENS
from mlxbun_core.testing.hub_cache import library_env, library_hub
from mlxbun_core.testing.process import serve

CHAT, RERANKER = "acme/Tiny-Llama-Chat", "acme/Qwen3-Reranker-Tiny"
MODELS = {CHAT: ("llama", {"seed": 11}),
          RERANKER: ("qwen3", {"seed": 5,
                               "special_tokens": [*FAMILY_SPECIAL_TOKENS["qwen3"], "yes", "no"]})}
QUERY, DOCS = "capital of France?", ["Paris is in France.", "a kitten", "Berlin"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    root = tmp_path_factory.mktemp("iso-rerank")
    return root, library_hub(root / "hf" / "hub", MODELS)


@pytest.fixture(scope="module")
def base(hub):
    with serve("--isolate", "--model-pool", "2", "Tiny-Llama", env=library_env(hub[0]),
               ready="/engine", timeout=180) as proc:
        yield proc.base


def test_rerank_is_routed_to_the_named_reranker(hub, base):
    model = loader.claim(hub[1][RERANKER], LoadOptions(model_id=RERANKER))
    want, used = reranker.rerank(model, QUERY, DOCS, None, None)
    r = httpx.post(base + "/v1/rerank", timeout=180,
                   json={"model": RERANKER, "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    got = {row["index"]: row["relevance_score"] for row in r.json()["results"]}
    assert got == pytest.approx(dict(enumerate(want)), abs=1e-6)
    assert r.json()["usage"]["total_tokens"] == used
    # the chat engine still answers, and it cannot rerank
    chat = httpx.post(base + "/v1/chat/completions", timeout=180, json={
        "model": CHAT, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert chat.status_code == 200, chat.text
    refused = httpx.post(base + "/v1/rerank", timeout=180,
                         json={"model": CHAT, "query": QUERY, "documents": DOCS})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "model"
