"""mlxbun-qwen3-embed: Qwen3-Embedding checkpoints served as embedding models, and
Qwen3-Reranker checkpoints served as rerankers.

A ``qwen3`` checkpoint is claimed when it looks like an embedding model
(sentence-transformers metadata in the directory, or "Embedding" in its name) or
when the operator forces it (``mlxbun serve --embedding``); a plain Qwen3 chat
checkpoint is left to the generic plugin.

Embedding follows Qwen3-Embedding: queries may carry an instruction
(``Instruct: {instruction}\\nQuery:{text}``), the text is tokenized without
special tokens and ``<|endoftext|>`` appended, one forward per text through
mlx-lm's ``qwen3`` backbone (final norm, no lm_head), last-token pooling and L2
normalisation. One text per forward keeps every vector bit-exact with a
single-sequence reference (no padding, no mask).

A ``qwen3`` checkpoint named like a reranker ("Reranker" in its model id, directory
or hub-cache repo) loads as ``kind="rerank"``; :mod:`.reranker` scores query-document
pairs with the model card's prompt and its "yes"/"no" logits.
"""

from __future__ import annotations

from pathlib import Path

from mlxbun_core.errors import BadRequest
from mlxbun_core.family import Family, load_mlx_lm
from mlxbun_core.hookspecs import hookimpl

from . import reranker

FAMILY = "qwen3_embed"
MODEL_TYPES = ("qwen3",)
ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3Model")
ST_FILES = ("modules.json", "config_sentence_transformers.json", "1_Pooling/config.json")
POOL_TOKEN = "<|endoftext|>"
QWEN3 = Family(FAMILY, MODEL_TYPES, ARCHITECTURES)


def is_qwen3(config: dict) -> bool:
    return QWEN3.matches(config)


def names_word(path: Path, model_id: str, word: str) -> bool:
    """``word`` in the model id, the directory name, or a hub cache repo folder
    (``models--Qwen--Qwen3-Embedding-0.6B/snapshots/<rev>``). Only these parts are
    looked at, so an unrelated parent directory never turns a chat model into one."""
    names = [model_id or "", path.name]
    names += [p for p in path.parts if p.startswith("models--")]
    return any(word in n.lower() for n in names)


def names_embedding(path: Path, model_id: str) -> bool:
    return names_word(path, model_id, "embedding")


def is_reranker_checkpoint(path: Path, options) -> bool:
    """Named like a reranker (Qwen3-Reranker ships no metadata that says so), unless
    the operator forces embedding mode."""
    if getattr(options, "embedding", False):
        return False
    return names_word(path, getattr(options, "model_id", ""), "reranker")


def is_embedding_checkpoint(path: Path, options) -> bool:
    if getattr(options, "embedding", False):
        return True
    if any((path / f).is_file() for f in ST_FILES):
        return True
    return names_embedding(path, getattr(options, "model_id", ""))


def format_text(text: str, instruction) -> str:
    return f"Instruct: {instruction}\nQuery:{text}" if instruction else text


def pool_token_id(tokenizer) -> int:
    tid = tokenizer.convert_tokens_to_ids(POOL_TOKEN)
    if tid is None or tid == getattr(tokenizer, "unk_token_id", None):
        pad = tokenizer.pad_token_id
        tid = pad if pad is not None else tokenizer.eos_token_id
    return tid


def tokenize(tokenizer, text: str, instruction=None) -> list:
    ids = list(tokenizer.encode(format_text(text, instruction), add_special_tokens=False))
    return ids + [pool_token_id(tokenizer)]


def embed_tokens(model, tokens: list):
    """Last-token pooled, L2-normalised float32 vector for one token sequence."""
    import mlx.core as mx

    hidden = model.model(mx.array(tokens)[None])  # backbone: final norm, no lm_head
    last = hidden[0, -1].astype(mx.float32)
    vec = last / mx.linalg.norm(last)
    mx.eval(vec)
    return vec


@hookimpl
def claims(path, config, options):
    if not is_qwen3(config):
        return None
    path = Path(path)
    if is_reranker_checkpoint(path, options) or is_embedding_checkpoint(path, options):
        return FAMILY
    return None


@hookimpl
def load_model(path, config, options):
    if not is_reranker_checkpoint(Path(path), options):
        return load_mlx_lm(path, config, options, kind="embedding")
    model = load_mlx_lm(path, config, options, kind="rerank")
    reranker.answer_ids(model.tokenizer)  # no "yes"/"no" tokens: fail the load, not requests
    return model


@hookimpl
def embed(model, texts, instruction):
    vectors, used = [], 0
    for text in texts:
        tokens = tokenize(model.tokenizer, text, instruction)
        used += len(tokens)
        vectors.append(embed_tokens(model.model, tokens).tolist())
    return vectors, used


@hookimpl
def rerank(model, query, documents, instruction, max_doc_tokens):
    if model.kind != "rerank":
        return None
    return reranker.rerank(model, query, documents, instruction, max_doc_tokens)


@hookimpl
def render_chat(model, messages, tools, template_kwargs, reasoning_effort):
    if model.kind == "rerank":
        raise BadRequest(f"model {model.id} is a reranker: it serves POST /v1/rerank only",
                         param="model")
    raise BadRequest(f"model {model.id} is an embedding model: it serves POST /v1/embeddings only",
                     param="model")
