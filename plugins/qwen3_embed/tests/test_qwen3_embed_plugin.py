"""The Qwen3-Embedding plugin and POST /v1/embeddings: claim rules, bit-exact vectors vs
mlx-lm's qwen3 forward, instruction format, usage, and the 400 cases."""

import asyncio

import httpx
import mlx.core as mx
import mlxbun_qwen3_embed
import numpy as np
import openai
import pytest
from mlx_lm import load as mlx_load

from mlxbun_core import loader
from mlxbun_core.engine.core import Engine
from mlxbun_core.errors import BadRequest
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint, write_checkpoint
from mlxbun_core.testing.conformance import FamilyChecks

# What a published Qwen3-Embedding snapshot carries besides the weights.
ST_FILES = {
    "modules.json": [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}],
    "1_Pooling/config.json": {
        "word_embedding_dimension": 64, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True, "include_prompt": True},
    "config_sentence_transformers.json": {
        "prompts": {"query": "Instruct: Given a web search query, retrieve relevant passages "
                             "that answer the query\nQuery:", "document": ""},
        "default_prompt_name": None, "similarity_fn_name": "cosine"},
}
TEXTS = ["the cat sat on the mat", "a kitten by the window", "", "tax law ü 東京"]
INSTR = "Given a web search query, retrieve relevant passages that answer the query"


@pytest.fixture(scope="module")
def ckpt():
    return tiny_checkpoint("qwen3", seed=11, extra_files=ST_FILES,
                           tokenizer_config_extra={"padding_side": "left"})


@pytest.fixture(scope="module")
def plain():
    return tiny_checkpoint("qwen3", seed=12)


@pytest.fixture(scope="module")
def reference(ckpt):
    """Independent computation: mlx-lm's own qwen3 model, hidden state of the last token
    (after the final norm), float32, L2-normalised."""
    model, tok = mlx_load(str(ckpt))
    eot = tok.convert_tokens_to_ids("<|endoftext|>")

    def ref(text):
        ids = tok.encode(text, add_special_tokens=False) + [eot]
        h = model.model(mx.array([ids]))[0, -1].astype(mx.float32)
        return np.array(h / mx.linalg.norm(h)), len(ids)

    return ref


def post(srv, path, body):
    return httpx.post(srv.v1 + path, json=body, timeout=60)


# -- claim ---------------------------------------------------------------------

def test_plain_qwen3_stays_generic_unless_forced(plain):
    m = loader.claim(plain, LoadOptions(model_id="Qwen/Qwen3-0.6B"))
    assert (m.family, m.kind) == ("generic", "generate")
    m = loader.claim(plain, LoadOptions(model_id="Qwen/Qwen3-0.6B", embedding=True))
    assert (m.family, m.kind) == ("qwen3_embed", "embedding")
    vecs, used = mlxbun_qwen3_embed.embed(model=m, texts=["hi"], instruction=None)
    assert len(vecs) == 1 and len(vecs[0]) == 64 and used >= 2


def test_name_based_detection(tmp_path, plain):
    d = write_checkpoint(tmp_path / "Qwen3-Embedding-0.6B", "qwen3", seed=1)
    assert loader.claim(d, LoadOptions(model_id="local")).family == "qwen3_embed"
    hub = write_checkpoint(tmp_path / "models--Qwen--Qwen3-Embedding-0.6B" / "snapshots" / "abc",
                           "qwen3", seed=1)
    assert loader.claim(hub, LoadOptions(model_id="x")).family == "qwen3_embed"
    by_id = LoadOptions(model_id="mlx-community/Qwen3-Embedding-4B-4bit-DWQ")
    assert loader.claim(plain, by_id).kind == "embedding"
    # an unrelated parent folder named like an embedding model does not count
    nested = write_checkpoint(tmp_path / "embedding-experiments" / "chat", "qwen3", seed=1)
    assert loader.claim(nested, LoadOptions(model_id="chat")).family == "generic"


# -- vectors ----------------------------------------------------------------------

def test_bit_exact_vs_mlx_lm_and_unit_norm(client, srv, reference):
    r = client.embeddings.create(model="anything", input=TEXTS, encoding_format="float")
    assert r.object == "list" and r.model == srv.engine.model.id
    assert [d.index for d in r.data] == list(range(len(TEXTS)))
    total = 0
    for d, text in zip(r.data, TEXTS):
        ours = np.array(d.embedding, dtype=np.float32)
        ref, n = reference(text)
        assert np.array_equal(ours, ref), text
        assert abs(float(np.linalg.norm(ours.astype(np.float64))) - 1.0) < 1e-5
        total += n
    assert r.usage.prompt_tokens == r.usage.total_tokens == total


def test_base64_is_the_same_vector(client):
    # the SDK asks for base64 by default and decodes it
    b64 = client.embeddings.create(model="m", input=TEXTS[:2])
    flt = client.embeddings.create(model="m", input=TEXTS[:2], encoding_format="float")
    for a, b in zip(b64.data, flt.data):
        assert np.array_equal(np.array(a.embedding, np.float32), np.array(b.embedding, np.float32))


def test_single_string_and_batch_independence(client):
    one = client.embeddings.create(model="m", input=TEXTS[1], encoding_format="float")
    many = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
    assert len(one.data) == 1 and one.data[0].embedding == many.data[1].embedding


def test_instruction_query_format(srv, reference):
    q = "what is a cat?"
    plain = post(srv, "/embeddings", {"input": q}).json()
    inst = post(srv, "/embeddings", {"input": q, "instruction": INSTR}).json()
    a, b = (np.array(x["data"][0]["embedding"], np.float32) for x in (plain, inst))
    assert not np.array_equal(a, b)
    ref, n = reference(f"Instruct: {INSTR}\nQuery:{q}")
    assert np.array_equal(b, ref) and inst["usage"]["prompt_tokens"] == n
    assert inst["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"]


# -- errors --------------------------------------------------------------------------

@pytest.mark.parametrize("body,param", [
    ({}, "input"),
    ({"input": 3}, "input"),
    ({"input": []}, "input"),
    ({"input": ["ok", 4]}, "input"),
    ({"input": [[1, 2, 3]]}, "input"),
    ({"input": {"text": "x"}}, "input"),
    ({"input": "x", "instruction": 5}, "instruction"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
])
def test_bad_input_is_400(srv, body, param):
    r = post(srv, "/embeddings", body)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_sdk_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="m", input=[])


def test_chat_against_embedding_model_is_400(srv):
    r = post(srv, "/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                        "max_tokens": 2})
    assert r.status_code == 400
    assert "embedding model" in r.json()["error"]["message"]


def test_non_embedding_model_embed_is_400(plain):
    engine = Engine.load(str(plain), progress=False)
    try:
        assert engine.model.family == "generic"
        with pytest.raises(BadRequest) as exc:
            asyncio.run(engine.embed(["hello"]))
        assert exc.value.status == 400 and exc.value.type == "invalid_request_error"
    finally:
        engine.worker.close()


class TestConformance(FamilyChecks):
    """The checks every family passes (mlxbun_core.testing.conformance)."""

    plugin = "qwen3_embed"
    embeddings = True
