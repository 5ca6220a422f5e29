"""Qwen3-Reranker scoring, as its model card defines it.

A (query, document) pair becomes one chat prompt: the card's system turn, then
``<Instruct>: ...\\n<Query>: ...\\n<Document>: ...`` as the user turn, then an
assistant turn with an empty think block. The relevance is the probability of
"yes" against "no" at the last position: ``softmax([logit_no, logit_yes])[1]``.

Pairs are scored in batches. Rows are sorted by length so a batch holds prompts
of similar size; shorter rows are left-padded and read through mlx-lm's
``BatchKVCache``, whose mask hides the padding and whose offsets start every
row's positions at 0, so a padded row scores as it would alone. Only the last
position goes through the output head.
"""

from __future__ import annotations

from typing import cast

SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the '
          'Instruct provided. Note that the answer can only be "yes" or "no".')
PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
YES, NO = "yes", "no"
MAX_PAIR_TOKENS = 8192  # the model card's max_length: the whole prompt, template included
BATCH_TOKENS = 8192  # padded tokens per forward pass
BATCH_ROWS = 16


def pair_text(query: str, document: str, instruction: str | None) -> str:
    return (f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n"
            f"<Document>: {document}")


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def answer_ids(tokenizer) -> tuple[int, int]:
    """The ids of "no" and "yes" (single vocabulary entries in Qwen3's tokenizer)."""
    ids = []
    for word in (NO, YES):
        tid = tokenizer.convert_tokens_to_ids(word)
        if tid is None or tid == getattr(tokenizer, "unk_token_id", None):
            raise ValueError(f"the tokenizer has no {word!r} token: "
                             "not a Qwen3-Reranker vocabulary")
        ids.append(int(tid))
    return ids[0], ids[1]


def pair_tokens(tokenizer, query: str, document: str, instruction: str | None,
                max_doc_tokens: int | None, limit: int) -> list[int]:
    """The prompt for one pair. ``max_doc_tokens`` cuts the document first; a prompt
    still over ``limit`` loses the tail of its pair text, as the card truncates."""
    if max_doc_tokens is not None:
        doc_ids = encode(tokenizer, document)
        if len(doc_ids) > max_doc_tokens:
            document = tokenizer.decode(doc_ids[:max_doc_tokens])
    prefix, suffix = encode(tokenizer, PREFIX), encode(tokenizer, SUFFIX)
    body = encode(tokenizer, pair_text(query, document, instruction))
    room = max(1, limit - len(prefix) - len(suffix))
    return prefix + body[:room] + suffix


def plan_batches(lengths: list[int], max_tokens: int | None = None,
                 max_rows: int | None = None) -> list[list[int]]:
    """Row indices grouped into batches, longest first: each batch's padded size
    (rows × its longest row) stays within ``max_tokens`` (a lone longer row goes alone)."""
    max_tokens, max_rows = max_tokens or BATCH_TOKENS, max_rows or BATCH_ROWS
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        current = batches[-1] if batches else None
        # sorted longest first: the batch's first row is its widest
        if (current is not None and len(current) < max_rows
                and (len(current) + 1) * lengths[current[0]] <= max_tokens):
            current.append(i)
        else:
            batches.append([i])
    return batches


def output_head(model, hidden):
    """The model's logits for ``hidden`` (its own head, tied or not)."""
    if getattr(model.args, "tie_word_embeddings", False):
        return model.model.embed_tokens.as_linear(hidden)
    return model.lm_head(hidden)


def score_rows(model, rows: list[list[int]], no_id: int, yes_id: int, pad_id: int) -> list[float]:
    """P(yes) for each prompt in ``rows``, in one forward pass."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    width = max(len(r) for r in rows)
    pads = [width - len(r) for r in rows]
    tokens = mx.array([[pad_id] * p + r for p, r in zip(pads, rows)])
    cache = [BatchKVCache(pads) for _ in model.layers] if any(pads) else None
    hidden = model.model(tokens, cache)[:, -1:, :]
    logits = output_head(model, hidden)[:, 0, :]
    pair = mx.stack([logits[:, no_id], logits[:, yes_id]], axis=1).astype(mx.float32)
    probs = mx.softmax(pair, axis=1)[:, 1]
    mx.eval(probs)
    return [float(p) for p in cast("list[float]", probs.tolist())]


def rerank(loaded, query: str, documents: list[str], instruction: str | None,
           max_doc_tokens: int | None) -> tuple[list[float], int]:
    """Scores for ``documents`` in their order, and the prompt tokens fed (no padding)."""
    tok = loaded.tokenizer
    no_id, yes_id = answer_ids(tok)
    limit = min(MAX_PAIR_TOKENS, loaded.context_window or MAX_PAIR_TOKENS)
    rows = [pair_tokens(tok, query, d, instruction, max_doc_tokens, limit) for d in documents]
    pad = tok.pad_token_id if tok.pad_token_id is not None else no_id
    scores = [0.0] * len(rows)
    for batch in plan_batches([len(r) for r in rows]):
        for i, s in zip(batch, score_rows(loaded.model, [rows[i] for i in batch],
                                          no_id, yes_id, pad)):
            scores[i] = s
    return scores, sum(len(r) for r in rows)
