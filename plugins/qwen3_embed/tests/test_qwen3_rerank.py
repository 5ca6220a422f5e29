"""Qwen3-Reranker through the qwen3_embed plugin and POST /v1/rerank: claim rules, scores
equal to mlx-lm's own forward of the model card's prompt, ordering, top_n,
return_documents, batching (padded rows, several worker calls) equal to one at a time,
the 400 cases, and the cohere SDK (v1 and v2 clients) as the client."""

import asyncio

import cohere
import httpx
import mlx.core as mx
import mlxbun_qwen3_embed
import pytest
from mlx_lm import load as mlx_load
from mlxbun_qwen3_embed import reranker as reranking

from mlxbun_core import loader
from mlxbun_core.engine import rerank as engine_rerank
from mlxbun_core.engine.core import Engine
from mlxbun_core.errors import BadRequest
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import (
    FAMILY_SPECIAL_TOKENS,
    tiny_checkpoint,
    tiny_reranker_checkpoint,
    write_checkpoint,
)

QUERY = "What is the capital of France?"
DOCS = ["The capital of France is Paris.", "a kitten by the window", "",
        "def fibonacci(n: int) -> int:\n    return n if n < 2 else fibonacci(n - 1)\n" * 3,
        "tax law ü 東京", "Berlin is the capital of Germany. " * 6]

# The model card's template, written out here (not read from the plugin).
CARD_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based "
               "on the Query and the Instruct provided. Note that the answer can only be "
               "\"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
ANSWERING = [*FAMILY_SPECIAL_TOKENS["qwen3"], "yes", "no"]  # a vocabulary with yes and no
CARD_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


@pytest.fixture(scope="module")
def ckpt():
    return tiny_reranker_checkpoint(seed=5)


@pytest.fixture(scope="module")
def reference(ckpt):
    """Independent computation: mlx-lm's own qwen3 model over the card's prompt, the
    full logits of the last position, softmax over [no, yes] in float32."""
    model, tok = mlx_load(str(ckpt))
    no, yes = tok.convert_tokens_to_ids("no"), tok.convert_tokens_to_ids("yes")

    def ref(doc, query=QUERY, instruction=CARD_INSTRUCTION):
        pair = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"
        ids = (tok.encode(CARD_PREFIX, add_special_tokens=False)
               + tok.encode(pair, add_special_tokens=False)
               + tok.encode(CARD_SUFFIX, add_special_tokens=False))
        logits = model(mx.array([ids]))[0, -1].astype(mx.float32)
        return float(mx.softmax(mx.stack([logits[no], logits[yes]]))[1]), len(ids)

    return ref


def post(srv, body, path="/v1/rerank"):
    return httpx.post(srv.base_url + path, json=body, timeout=120)


def rerank_ok(srv, path="/v1/rerank", **body):
    r = post(srv, {"model": "m", "query": QUERY, "documents": DOCS, **body}, path)
    assert r.status_code == 200, r.text
    return r.json()


def scores_by_index(answer):
    return {row["index"]: row["relevance_score"] for row in answer["results"]}


# -- claim ---------------------------------------------------------------------------

def test_claimed_as_a_reranker_by_name(tmp_path, ckpt):
    m = loader.claim(ckpt, LoadOptions(model_id="local"))
    assert (m.family, m.kind) == ("qwen3_embed", "rerank")
    plain = tiny_checkpoint("qwen3", seed=12, special_tokens=ANSWERING)
    by_id = loader.claim(plain, LoadOptions(model_id="mlx-community/Qwen3-Reranker-0.6B-4bit"))
    assert by_id.kind == "rerank"
    hub = write_checkpoint(tmp_path / "models--Qwen--Qwen3-Reranker-0.6B" / "snapshots" / "abc",
                           "qwen3", seed=1, special_tokens=ANSWERING)
    assert loader.claim(hub, LoadOptions(model_id="x")).kind == "rerank"
    # a vocabulary without the answer tokens fails the load, not every request
    with pytest.raises(ValueError, match="no 'no' token"):
        loader.claim(tiny_checkpoint("qwen3", seed=12), LoadOptions(model_id="Qwen3-Reranker"))
    # an unrelated parent folder named like a reranker does not count
    nested = write_checkpoint(tmp_path / "reranker-experiments" / "chat", "qwen3", seed=1)
    assert loader.claim(nested, LoadOptions(model_id="chat")).family == "generic"
    # --embedding wins over the name
    forced = loader.claim(ckpt, LoadOptions(model_id="local", embedding=True))
    assert forced.kind == "embedding"


# -- scores ----------------------------------------------------------------------------

def test_scores_equal_mlx_lm_on_the_card_prompt(srv, reference):
    answer = rerank_ok(srv)
    got = scores_by_index(answer)
    assert sorted(got) == list(range(len(DOCS)))
    total = 0
    for i, doc in enumerate(DOCS):
        want, n = reference(doc)
        assert got[i] == pytest.approx(want, abs=1e-6), doc
        total += n
    assert answer["usage"] == {"prompt_tokens": total, "total_tokens": total}
    assert answer["meta"]["tokens"] == {"input_tokens": total, "output_tokens": 0}
    assert answer["model"] == srv.engine.model.id and answer["id"].startswith("rerank-")
    assert len(set(got.values())) == len(DOCS)  # random weights still tell documents apart


def test_one_document_is_bit_exact(srv, reference):
    for doc in DOCS[:2]:
        answer = post(srv, {"query": QUERY, "documents": [doc]}).json()
        assert answer["results"][0]["relevance_score"] == reference(doc)[0]


def test_instruction_reaches_the_prompt(srv, reference):
    instruction = "Find code that computes Fibonacci numbers"
    answer = rerank_ok(srv, instruction=instruction)
    got = scores_by_index(answer)
    default = scores_by_index(rerank_ok(srv))
    assert got != default
    for i, doc in enumerate(DOCS):
        assert got[i] == pytest.approx(reference(doc, instruction=instruction)[0], abs=1e-6)


def test_results_are_ordered_most_relevant_first(srv):
    answer = rerank_ok(srv)
    scores = [row["relevance_score"] for row in answer["results"]]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 < s < 1.0 for s in scores)


def test_top_n_keeps_the_best(srv):
    full = rerank_ok(srv)["results"]
    assert rerank_ok(srv, top_n=2)["results"] == full[:2]
    assert rerank_ok(srv, top_n=1)["results"] == full[:1]
    assert rerank_ok(srv, top_n=100)["results"] == full  # more than there are: all of them


def test_return_documents(srv):
    objects = [{"text": "Paris", "id": "a"}, "Berlin"]
    r = post(srv, {"query": QUERY, "documents": objects}).json()
    echoed = {row["index"]: row["document"] for row in r["results"]}
    assert echoed == {0: {"text": "Paris", "id": "a"}, 1: {"text": "Berlin"}}
    r = post(srv, {"query": QUERY, "documents": objects, "return_documents": False}).json()
    assert all("document" not in row for row in r["results"]) and len(r["results"]) == 2
    # an object document scores its text, like the same string
    plain = post(srv, {"query": QUERY, "documents": ["Paris", "Berlin"]}).json()
    assert scores_by_index(plain) == scores_by_index(r)


def test_every_route_answers_alike(srv):
    want = scores_by_index(rerank_ok(srv))
    for path in ("/rerank", "/v2/rerank"):
        answer = rerank_ok(srv, path=path)
        assert scores_by_index(answer) == want, path
    assert rerank_ok(srv, path="/v2/rerank")["meta"]["api_version"] == {"version": "2"}


def test_max_tokens_per_doc_cuts_documents(srv, reference):
    long_doc = DOCS[-1]
    tok = srv.engine.model.tokenizer
    cut = tok.decode(tok.encode(long_doc, add_special_tokens=False)[:5])
    r = post(srv, {"query": QUERY, "documents": [long_doc], "max_tokens_per_doc": 5}).json()
    want, n = reference(cut)
    assert r["results"][0]["relevance_score"] == pytest.approx(want, abs=1e-6)
    assert r["usage"]["total_tokens"] == n < reference(long_doc)[1]


# -- batching ----------------------------------------------------------------------------

def test_padded_batches_equal_one_at_a_time(ckpt, monkeypatch):
    m = loader.claim(ckpt, LoadOptions(model_id="local"))
    lengths = {len(reranking.pair_tokens(m.tokenizer, QUERY, d, None, None, 8192))
               for d in DOCS}
    assert len(lengths) == len(DOCS)  # every row of a batch but the longest is padded
    batched, used = reranking.rerank(m, QUERY, DOCS, None, None)
    alone = [reranking.rerank(m, QUERY, [d], None, None)[0][0] for d in DOCS]
    assert batched == pytest.approx(alone, abs=1e-6)
    # several smaller batches: the same scores
    monkeypatch.setattr(reranking, "BATCH_ROWS", 2)
    assert reranking.plan_batches(sorted(lengths)) != [list(range(len(DOCS)))]
    assert reranking.rerank(m, QUERY, DOCS, None, None) == (batched, used)


def test_plan_batches_groups_by_length():
    lengths = [10, 300, 12, 290, 11]
    assert reranking.plan_batches(lengths, max_tokens=700, max_rows=4) == [[1, 3], [2, 4, 0]]
    assert reranking.plan_batches([5000], max_tokens=100) == [[0]]  # a long row goes alone
    assert reranking.plan_batches([4] * 5, max_tokens=1000, max_rows=2) == [[0, 1], [2, 3], [4]]


def test_several_worker_calls_equal_one(srv, monkeypatch):
    want = scores_by_index(rerank_ok(srv))
    monkeypatch.setattr(engine_rerank, "RERANK_CALL", 2)
    assert scores_by_index(rerank_ok(srv)) == want


# -- errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("body,param", [
    ({"documents": ["a"]}, "query"),
    ({"query": 3, "documents": ["a"]}, "query"),
    ({"query": "  ", "documents": ["a"]}, "query"),
    ({"query": "q"}, "documents"),
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "q", "documents": "a"}, "documents"),
    ({"query": "q", "documents": ["a", 4]}, "documents"),
    ({"query": "q", "documents": [{"title": "no text"}]}, "documents"),
    ({"query": "q", "documents": ["a"] * 1001}, "documents"),
    ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": True}, "top_n"),
    ({"query": "q", "documents": ["a"], "top_n": 1.5}, "top_n"),
    ({"query": "q", "documents": ["a"], "return_documents": "yes"}, "return_documents"),
    ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ({"query": "q", "documents": ["a"], "instruction": 5}, "instruction"),
])
def test_bad_bodies_are_400(srv, body, param):
    r = post(srv, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param
    assert rerank_ok(srv, top_n=1)["results"]  # the next request is served


def test_chat_against_a_reranker_is_400(srv):
    r = httpx.post(srv.v1 + "/chat/completions", timeout=60,
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 400
    assert "reranker" in r.json()["error"]["message"] and "/v1/rerank" in r.json()["error"][
        "message"]


def test_the_models_row_says_rerank(srv):
    row = httpx.get(srv.v1 + "/models", timeout=30).json()["data"][0]
    assert row["capabilities"]["rerank"] is True
    assert row["capabilities"]["embeddings"] is False


@pytest.mark.parametrize("kind", ["generic", "embedding"])
def test_a_model_that_cannot_rerank_is_400(kind):
    path = (tiny_checkpoint("qwen3", seed=12) if kind == "generic" else
            tiny_checkpoint("qwen3", seed=11, folder="Qwen3-Embedding-tiny"))
    engine = Engine.load(str(path), progress=False)
    try:
        assert engine.model.kind == ("generate" if kind == "generic" else "embedding")
        with pytest.raises(BadRequest) as exc:
            asyncio.run(engine.rerank("q", ["a"]))
        assert exc.value.status == 400 and exc.value.param == "model"
        assert "cannot rerank" in str(exc.value)
        assert mlxbun_qwen3_embed.rerank(model=engine.model, query="q", documents=["a"],
                                         instruction=None, max_doc_tokens=None) is None
    finally:
        engine.worker.close()


# -- the cohere SDK -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base_url(srv):
    return srv.base_url


def test_cohere_v2_client(base_url, srv):
    co = cohere.ClientV2(base_url=base_url, api_key="unused")
    r = co.rerank(model="m", query=QUERY, documents=DOCS, top_n=3)
    want = rerank_ok(srv, top_n=3)["results"]
    assert [(x.index, x.relevance_score) for x in r.results] == \
        [(w["index"], w["relevance_score"]) for w in want]
    assert r.meta.api_version.version == "2" and r.meta.tokens.input_tokens > 0


def test_cohere_v1_client_with_documents(base_url):
    co = cohere.Client(base_url=base_url, api_key="unused")
    r = co.rerank(model="m", query=QUERY, documents=DOCS[:3], return_documents=True)
    assert sorted(x.index for x in r.results) == [0, 1, 2]
    assert all(x.document.text == DOCS[x.index] for x in r.results)


def test_cohere_sdk_raises_bad_request(base_url):
    co = cohere.ClientV2(base_url=base_url, api_key="unused")
    with pytest.raises(cohere.BadRequestError) as exc:
        co.rerank(model="m", query=QUERY, documents=[])
    assert exc.value.body["error"]["param"] == "documents"
