"""A token's text and raw bytes for logprobs, on real tokenizers of both vocabulary kinds:
byte-level BPE (GPT-2's alphabet: SmolLM2, Qwen, Llama 3) and sentencepiece (``▁`` for a
space, ``<0xNN>`` byte tokens: Llama 2, Gemma), each loaded through mlx-lm's own loader so
the detokenizer the engine uses is the one whose vocabulary is read."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer
from mlx_lm.tokenizer_utils import load as load_tokenizer
from tokenizers import Tokenizer, decoders, models, normalizers, trainers

from mlxbun_core.engine.logprobs import LogprobRecorder, TokenPieces, byte_level_alphabet
from mlxbun_core.testing.checkpoints import tiny_checkpoint

TEXT = "Hello naïve café ☃ 東京 world"


@pytest.fixture(scope="module")
def bpe():
    tok = load_tokenizer(tiny_checkpoint("llama", seed=3))
    assert isinstance(tok._detokenizer, BPEStreamingDetokenizer)
    return tok


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    """A Llama-2-style sentencepiece tokenizer: BPE with byte fallback, ``▁`` spaces."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    tok.train_from_iterator(["Hello world, the world says hello.", "naive cafe"] * 20, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):  # the byte tokens every sentencepiece vocabulary carries
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    path = tmp_path_factory.mktemp("spm")
    (path / "tokenizer.json").write_text(json.dumps(data))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>"}))
    loaded = load_tokenizer(path)
    assert isinstance(loaded._detokenizer, SPMStreamingDetokenizer)
    return loaded


def joined(pieces: TokenPieces, ids: list[int]) -> bytes:
    return b"".join(pieces.get(i)[1] for i in ids)


def test_byte_level_bytes_join_to_the_exact_text(bpe):
    pieces = TokenPieces(bpe)
    ids = bpe.encode(TEXT, add_special_tokens=False)
    assert joined(pieces, ids) == TEXT.encode()
    partial = [i for i in ids if pieces.get(i)[0] != bpe.decode([i])]
    assert not partial  # a whole-character token's text is the tokenizer's own decode
    split = [i for i in ids if "\ufffd" in pieces.get(i)[0]]
    assert split, "needs a token that holds part of a character"
    for i in split:  # its bytes are raw, its text the lossy decode of them
        text, raw = pieces.get(i)
        assert text == raw.decode("utf-8", "replace") and raw


def test_byte_level_space_and_control_bytes(bpe):
    alphabet = byte_level_alphabet()
    assert len(alphabet) == 256 and sorted(alphabet.values()) == list(range(256))
    pieces = TokenPieces(bpe)
    space = bpe.encode(" world", add_special_tokens=False)
    assert joined(pieces, space) == b" world" and pieces.get(space[0])[1].startswith(b" ")
    newline = bpe.encode("a\n\tb", add_special_tokens=False)
    assert joined(pieces, newline) == b"a\n\tb"


def test_added_tokens_are_literal(bpe):
    pieces = TokenPieces(bpe)
    eos = sorted(bpe.eos_token_ids)[0]
    name = bpe.convert_ids_to_tokens([eos])[0]
    assert pieces.get(eos) == (name, name.encode())


def test_sentencepiece_spaces_and_byte_tokens(spm):
    pieces = TokenPieces(spm)
    ids = spm.encode(TEXT, add_special_tokens=False)
    assert joined(pieces, ids) == b" " + TEXT.encode()  # sentencepiece's leading "▁"
    first = pieces.get(ids[0])
    assert first[0].startswith(" ") and "▁" not in first[0]
    byte_tok = spm.convert_tokens_to_ids("<0xE2>")
    assert pieces.get(byte_tok) == ("\ufffd", b"\xe2")


def test_recorder_entry_is_the_sampled_token_with_a_sorted_top(bpe):
    vocab = len(bpe)
    logits = mx.random.normal((vocab,), key=mx.random.key(0))
    logprobs = logits - mx.logsumexp(logits)
    sampled = int(mx.argmin(logprobs).item())  # the least likely: surely not in the top
    entry = LogprobRecorder(bpe, 4).entry(sampled, logprobs)
    text, raw = TokenPieces(bpe).get(sampled)
    assert (entry["id"], entry["token"], entry["bytes"]) == (sampled, text, list(raw))
    assert entry["logprob"] == pytest.approx(logprobs[sampled].item())
    order = sorted(range(vocab), key=lambda i: -logprobs[i].item())[:4]
    assert [t["id"] for t in entry["top_logprobs"]] == order
    assert all(set(t) == {"id", "token", "logprob", "bytes"} for t in entry["top_logprobs"])
    plain = LogprobRecorder(bpe, 0).entry(sampled, logprobs)
    assert plain["top_logprobs"] == [] and plain["token"] == text


def test_ids_past_the_vocabulary_are_empty(bpe):
    assert TokenPieces(bpe).get(len(bpe) + 5) == ("", b"")


def test_a_recorded_byte_token_reports_its_raw_byte(spm):
    """``<0xE2>`` (a third of "☃") is the byte 226, not the UTF-8 of its lossy text."""
    byte_tok = spm.convert_tokens_to_ids("<0xE2>")
    logits = mx.zeros((len(spm),)).at[byte_tok].add(10.0)
    entry = LogprobRecorder(spm, 2).entry(byte_tok, logits - mx.logsumexp(logits))
    assert (entry["token"], entry["bytes"]) == ("\ufffd", [0xE2])
    assert entry["top_logprobs"][0]["id"] == byte_tok
    assert entry["top_logprobs"][0]["bytes"] == [0xE2]


def test_served_bytes_of_a_split_character_join_to_it(bpe):
    """Over HTTP, each token of "☃" (three byte-level tokens here), sampled by a logit
    bias: the entries' ``bytes`` join to the character's UTF-8 on both surfaces."""
    import openai

    from mlxbun_core.testing.server import running_server

    ids = bpe.encode("☃", add_special_tokens=False)
    assert len(ids) > 1, "needs a character split over tokens"
    with running_server(tiny_checkpoint("llama", seed=3)) as srv:
        client = openai.OpenAI(base_url=srv.v1, api_key="x", max_retries=0)
        chat, text = b"", b""
        for i in ids:
            bias = {str(i): 100}
            r = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Draw a snowman"}],
                max_tokens=1, temperature=0, logprobs=True, top_logprobs=2, logit_bias=bias)
            entry = r.choices[0].logprobs.content[0]
            assert entry.top_logprobs[0].bytes == entry.bytes
            chat += bytes(entry.bytes)
            c = client.completions.create(  # logprobs as mlx-lm takes it: a boolean
                model="m", prompt="A snowman:", max_tokens=1, temperature=0, logit_bias=bias,
                extra_body={"logprobs": True})
            text += bytes(c.choices[0].logprobs.model_extra["content"][0]["bytes"])
    assert chat == text == "☃".encode()
