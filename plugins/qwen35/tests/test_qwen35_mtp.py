"""The Qwen3.5 plugin's MTP head (``mtp.py``): it loads the checkpoint's ``mtp.*`` tensors
(HF layout: zero-centred norms) into mlx-lm's decoder layer, shares the target's
embeddings and head, and answers ``token_predictor`` only for checkpoints that have it.
Served behaviour (greedy parity, rollback, usage) is tests/test_mtp.py."""

from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_load
from mlxbun_qwen35.mtp import load_predictor
from mlxbun_qwen35.mtp_weights import read, weight_files

from mlxbun_core import loader
from mlxbun_core.contract import TokenPredictor
from mlxbun_core.model import LoadOptions
from mlxbun_core.testing.checkpoints import tiny_checkpoint


def _predictor(path):
    model, _ = mlx_load(str(path))
    return load_predictor(SimpleNamespace(path=path, model=model, config={}, id="t")), model


@pytest.mark.parametrize("model_type", ["qwen3_5", "qwen3_5_moe"])
def test_the_copy_head_proposes_the_token_it_is_given(model_type):
    """The testing builder's "copy" head: identity ``fc`` on the embedding, a layer that
    adds nothing; with tied embeddings and the norms' +1 applied the logits are E @ E[t] and
    t wins. Without
    the +1 (zero norms) every logit would be 0. The MoE head's experts arrive fused, as
    HF stores them, and load into mlx-lm's stacked ``switch_mlp``."""
    path = tiny_checkpoint(model_type, mtp="copy", dtype="float32")
    predictor, model = _predictor(path)
    assert isinstance(predictor, TokenPredictor)
    assert (type(predictor.head.layers[0].mlp).__name__ == "Qwen3NextSparseMoeBlock") \
        == (model_type == "qwen3_5_moe")
    cache = model.make_cache()
    tokens = mx.array([[5, 17, 99, 240, 7]])
    logits, hidden = predictor.forward(tokens, cache)
    plain = model(tokens, cache=model.make_cache())
    assert mx.allclose(logits, plain, atol=1e-5).item()  # the target's own logits
    head_cache = predictor.make_cache()
    head_logits, state = predictor.predict(hidden, tokens, head_cache)
    assert head_logits.shape == (1, plain.shape[-1]) and state.shape == hidden.shape
    assert head_cache[0].offset == tokens.shape[1]  # a row per pair
    if model.language_model.args.tie_word_embeddings:  # (the tiny MoE's head is untied)
        picks = [mx.argmax(predictor.predict(hidden[:, i:i + 1], tokens[:, i:i + 1],
                                             predictor.make_cache())[0]).item()
                 for i in range(tokens.shape[1])]
        assert picks == tokens[0].tolist()


def test_only_checkpoints_with_the_head_offer_it():
    headless = tiny_checkpoint("qwen3_5", dtype="float32")
    assert weight_files(headless) == []
    predictor, _ = _predictor(headless)
    assert predictor is None
    with_head = tiny_checkpoint("qwen3_5", mtp="random", dtype="float32")
    loaded = loader.load(str(with_head), LoadOptions())
    offered = loaded.hooks.token_predictor(model=loaded)
    assert offered is not None and offered.num_draft_tokens == 2
    plain = loader.load(str(headless), LoadOptions())
    assert plain.hooks.token_predictor(model=plain) is None


def test_the_head_is_read_from_its_byte_ranges_in_bfloat16():
    """Only the ``mtp.*`` tensors are read, straight from the file; they must equal what
    ``mx.load`` (which reads the whole file) gives, bfloat16 included."""
    path = tiny_checkpoint("qwen3_5", mtp="random")  # bfloat16, like published weights
    files = weight_files(path)
    ours, whole = read(files), mx.load(str(files[0]))
    assert set(ours) == {k for k in whole if k.startswith("mtp.")}
    for k, v in ours.items():
        assert v.dtype == whole[k].dtype == mx.bfloat16 and mx.array_equal(v, whole[k]).item()


def test_the_paged_heads_draft_what_each_head_drafts_alone():
    """The batch lane's heads (``engine/speculate/mtp_head.py``: every row's head KV in
    blocks of one pool): rows of different history lengths, each appending a different
    number of states a step (none, for one row, in the second), draft in shared calls
    exactly what each row's own head drafts, over two steps (the chained positions
    dropped in between), and hold what each own head holds."""
    from mlx_lm.models.cache import trim_prompt_cache

    from mlxbun_core.engine.speculate.mtp_head import HeadPages, pageable

    predictor, _ = _predictor(tiny_checkpoint("qwen3_5", mtp="random", dtype="float32"))
    size = predictor.text.args.hidden_size
    mx.random.seed(5)

    def states(k):
        return mx.random.normal((1, k, size))

    def alone(cache, hidden, after, x, depth):
        logits, state = predictor.predict(hidden, mx.array([after + [x]]), cache)
        drafts = [mx.argmax(logits, axis=-1).item()]
        for _ in range(depth - 1):
            logits, state = predictor.predict(state[:, -1:], mx.array([[drafts[-1]]]), cache)
            drafts.append(mx.argmax(logits, axis=-1).item())
        trim_prompt_cache(cache, depth - 1)
        return drafts

    histories = [3, 7, 1]
    pages = HeadPages(predictor, pageable(predictor.make_cache()))
    ref = []
    for uid, n in enumerate(histories):  # each row's head reads its "prompt" on its own
        own, mine = predictor.make_cache(), predictor.make_cache()
        hidden, tokens = states(n), mx.array([list(range(10, 10 + n))])
        for cache in (own, mine):
            predictor.predict(hidden, tokens, cache)
        pages.add(uid, own)  # (moved in as the lone stream hands it over)
        ref.append(mine)
    for step, ks in enumerate([[1, 3, 2], [2, 0, 1]]):
        rows = [r for r, k in enumerate(ks) if k]
        pending = {r: states(ks[r]) for r in rows}
        after = {r: list(range(20 + step, 20 + step + ks[r] - 1)) for r in rows}
        xs = {r: 40 + r for r in rows}
        more = [r for r in rows if ks[r] > 1]
        width = max(ks[r] - 1 for r in more)
        grid = mx.concatenate([mx.concatenate([pending[r][:, :-1], mx.zeros(
            (1, width - ks[r] + 1, size))], axis=1) for r in more])
        pages.append(more, grid, mx.array([after[r] + [0] * (width - len(after[r]))
                                           for r in more]), [ks[r] - 1 for r in more])
        logits, state = pages.append(rows, mx.concatenate([pending[r][:, -1:] for r in rows]),
                                     mx.array([[xs[r]] for r in rows]), [1] * len(rows))
        drafts = [mx.argmax(logits, axis=-1)]
        lengths = [pages.length(r) for r in rows]
        for _ in range(2):
            logits, state = pages.append(rows, state[:, -1:], drafts[-1][:, None],
                                         [1] * len(rows))
            drafts.append(mx.argmax(logits, axis=-1))
        pages.rewind(rows, lengths)
        got = mx.stack(drafts, axis=1).tolist()
        for j, r in enumerate(rows):
            assert got[j] == alone(ref[r], pending[r], after[r], xs[r], 3), (step, r)
    for r, cache in enumerate(ref):
        (exported,) = pages.export(r)
        n = cache[0].offset
        assert exported.offset == n
        assert mx.allclose(exported.keys[..., :n, :], cache[0].keys[..., :n, :],
                           atol=1e-5).item()
        pages.drop(r)
    assert pages.pool.used == 0


def test_the_heads_read_prompts_from_the_batched_prefill():
    """On the batch lane the heads read their rows' prompts from the batch's prefill
    passes (the executor's tap): prompts of different lengths, read in several chunks
    with right padding beside a plain row, leave each head the rows the serial loop's own
    read gives it (the target's state at each position paired with the next prompt
    token), and the last prompt token's state pending after the first decode step."""
    from mlxbun_core.engine.batch import Batch, BlockPool
    from mlxbun_core.engine.batch.layout import layout
    from mlxbun_core.engine.speculate.mtp_batch import MtpBatch

    predictor, model = _predictor(tiny_checkpoint("qwen3_5", mtp="random", dtype="float32"))
    prompts = [[5, 17, 99, 240, 7, 31, 8, 64, 12], [3, 44, 250, 6], [9, 9, 81, 2, 77, 5]]
    mtp = MtpBatch(predictor)
    batch = Batch(model, layout(model), BlockPool(4, 8, 1000), tap=mtp)
    for uid, prompt in enumerate(prompts):
        batch.add(uid, prompt, budget=4, tapped=uid != 2)
        if uid != 2:
            mtp.add(uid, 2, None, SimpleNamespace(speculation=None))
    while batch.prefilling:
        batch.prefill({u: 3 for u in batch.prefilling})
    batch.decode()  # the prompts' last tokens
    for uid, prompt in enumerate(prompts[:2]):
        _, hidden = predictor.forward(mx.array([prompt]), model.make_cache())
        alone = predictor.make_cache()
        predictor.predict(hidden[:, :-1], mx.array([prompt[1:]]), alone)
        (head,) = mtp.pages.export(uid)
        n = len(prompt) - 1
        assert head.offset == n
        assert mx.allclose(head.keys[..., :n, :], alone[0].keys[..., :n, :],
                           atol=1e-4).item()
        pending = mtp.rows[uid].hidden
        assert pending.shape[1] == 1
        assert mx.allclose(pending, hidden[:, -1:], atol=1e-4).item()
    batch.close()
    for uid in (0, 1):
        mtp.drop(uid)
    assert batch.pool.used == 0 and mtp.pages.pool.used == 0


@pytest.mark.parametrize("dtype,size", [("float32", 4), (None, 2)])  # None: bfloat16
def test_the_head_names_the_kv_it_adds_per_token(dtype, size):
    """``kv_bytes_per_token`` (what memory admission bills per token of an MTP row) is the
    config's arithmetic for one full-attention layer, K and V in the activation dtype, and
    what the head's cache really holds after reading rows."""
    path = tiny_checkpoint("qwen3_5", mtp="random", dtype=dtype)
    loaded = loader.load(str(path), LoadOptions())
    predictor = loaded.hooks.token_predictor(model=loaded)
    text = loaded.config.get("text_config", loaded.config)
    assert predictor.kv_bytes_per_token == (text["num_key_value_heads"] * text["head_dim"]
                                            * 2 * size)
    tokens = mx.array([[5, 17, 99, 240, 7, 3, 11]])
    _, hidden = predictor.forward(tokens, loaded.model.make_cache())
    head_cache = predictor.make_cache()
    predictor.predict(hidden, tokens, head_cache)
    kv = head_cache[0]  # its buffers grow in steps: count the rows it holds
    held = sum(a[..., :kv.offset, :].nbytes for a in (kv.keys, kv.values))
    assert held == tokens.shape[1] * predictor.kv_bytes_per_token


@pytest.mark.parametrize("model_type,dtype", [("qwen3_5", "float32"), ("qwen3_5", None),
                                              ("qwen3_5_moe", "float32")])
def test_the_head_names_its_weight_bytes_before_loading_them(model_type, dtype):
    """``weight_bytes`` (what memory admission bills once ``loaded``) comes from the file
    headers before anything is read, and is what the loaded head's parameters hold:
    bfloat16 kept as stored, the MoE head's fused experts split into mlx-lm's stacks."""
    from mlxbun_core.models.facts import weight_bytes

    path = tiny_checkpoint(model_type, mtp="random", dtype=dtype)
    loaded = loader.load(str(path), LoadOptions())
    predictor = loaded.hooks.token_predictor(model=loaded)
    assert not predictor.loaded and predictor.weight_bytes > 0
    predictor.make_cache()
    assert predictor.loaded
    assert weight_bytes(predictor.head) == predictor.weight_bytes
