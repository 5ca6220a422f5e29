"""Log-probabilities of generated tokens, in OpenAI's per-position shape.

Each position is ``{"id", "token", "logprob", "bytes", "top_logprobs": [...]}``: the token
that was output (never the argmax in its place), its decoded text, its raw UTF-8 bytes and,
when ``top_logprobs`` is asked for, the k most likely tokens, sorted. ``id`` is ours
(mlx_lm.server reports it); the rest is what the OpenAI SDKs and evaluation tools read.

A token's bytes come from the vocabulary the tokenizer's own streaming detokenizer
already holds: byte-level BPE pieces (GPT-2's byte-to-character alphabet: SmolLM2, Qwen,
Llama 3) map back through that alphabet, sentencepiece pieces are bytes already (``▁``
is a space, ``<0xNN>`` a single raw byte). A token that is part of a multi-byte character
reports its raw bytes and, as ``token``, their lossy text (U+FFFD for the missing part);
joining ``bytes`` across positions gives the exact text.
"""

from __future__ import annotations

import functools
import math
import weakref
from typing import TYPE_CHECKING, Any, cast

from ..contract import Tokenizer

if TYPE_CHECKING:
    import mlx.core as mx

LOGPROB_FLOOR = -9999.0  # OpenAI's value for an impossible token; JSON has no -Infinity
SPM_SPACE = "\u2581".encode()
MAX_PIECES = 1 << 16  # cached token pieces per tokenizer (~10 MB at most), then cleared


def json_logprob(value: float) -> float:
    """A masked token (a grammar, an overflowing bias) has log-prob -inf or NaN: floor it."""
    return value if math.isfinite(value) else LOGPROB_FLOOR


@functools.lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for
    themselves, the others are shifted to U+0100 and up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars, shifted = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + shifted)] = b
            shifted += 1
    return chars


def byte_level_bytes(piece: str) -> bytes:
    """A byte-level BPE vocabulary piece as raw bytes (characters outside the alphabet,
    as in some added tokens, count as their UTF-8)."""
    alphabet = byte_level_alphabet()
    out = bytearray()
    for c in piece:
        b = alphabet.get(c)
        if b is None:
            out += c.encode()
        else:
            out.append(b)
    return bytes(out)


class TokenPieces:
    """Token id -> ``(text, raw bytes)``, computed once per id and cached."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        detok = tokenizer.detokenizer
        tokenmap = getattr(detok, "tokenmap", None)
        self._map = tokenmap if isinstance(tokenmap, list) and tokenmap else None
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        # added tokens (chat markers, EOS) are literal text in every vocabulary kind
        self._added = {int(i): str(getattr(t, "content", t)) for i, t in added.items()}
        self._cache: dict[int, tuple[str, bytes]] = {}

    def raw(self, token: int) -> bytes:
        """The bytes ``token`` stands for (empty for an id past the tokenizer's vocabulary,
        which a padded output layer can still rank)."""
        piece = None
        if self._map is not None and 0 <= token < len(self._map):
            piece = self._map[token]
        if isinstance(piece, (bytes, bytearray)):  # sentencepiece: bytes already (<0xNN> too)
            return bytes(piece).replace(SPM_SPACE, b" ")
        if token in self._added:  # literal, though it may hold characters of the alphabet
            return self._added[token].encode()
        if isinstance(piece, str):
            return byte_level_bytes(piece)
        if self._map is not None:
            return b""
        try:  # a detokenizer without a vocabulary map: the tokenizer's own decode
            text: str = self.tokenizer.decode([token])
            return text.encode()
        except Exception:
            return b""

    def get(self, token: int) -> tuple[str, bytes]:
        hit = self._cache.get(token)
        if hit is None:
            raw = self.raw(token)
            hit = (raw.decode("utf-8", "replace"), raw)
            if len(self._cache) >= MAX_PIECES:
                self._cache.clear()
            self._cache[token] = hit
        return hit


_pieces: weakref.WeakKeyDictionary[Tokenizer, TokenPieces] = weakref.WeakKeyDictionary()


def pieces_for(tokenizer: Tokenizer) -> TokenPieces:
    """The tokenizer's shared :class:`TokenPieces` (one per tokenizer object)."""
    try:
        found = _pieces.get(tokenizer)
    except TypeError:  # not weak-referenceable: a private table
        return TokenPieces(tokenizer)
    if found is None:
        found = _pieces[tokenizer] = TokenPieces(tokenizer)
    return found


class LogprobRecorder:
    """Builds one position's entry from the sampled token and the step's log-probs.

    The distribution is the one mlx-lm samples from (after logits processors, before
    temperature and the samplers). One evaluation per token: the sampled token's value
    and the top k are gathered together.
    """

    def __init__(self, tokenizer: Tokenizer, top_k: int):
        self.pieces = pieces_for(tokenizer)
        self.k = max(0, top_k)

    def _item(self, token: int, logprob: float | None) -> dict[str, Any]:
        text, raw = self.pieces.get(token)
        value = None if logprob is None else json_logprob(logprob)
        return {"id": token, "token": text, "logprob": value, "bytes": list(raw)}

    def ranked(self, token: int, logprob: float | None, top_ids: list[int],
               top_values: list[float]) -> dict[str, Any]:
        """One position's entry from gathered values (``logprob`` None: the prompt's
        first token, which nothing predicts); the alternatives sorted by value, then id,
        so the order is the same on every lane and run."""
        ranked = sorted(zip(top_ids, top_values), key=lambda p: (-json_logprob(p[1]), p[0]))
        return dict(self._item(token, logprob),
                    top_logprobs=[self._item(i, v) for i, v in ranked])

    def entry(self, token: int, logprobs: mx.array) -> dict[str, Any]:
        import mlx.core as mx

        token = int(token)
        if self.k == 0:
            return dict(self._item(token, cast(float, logprobs[token].item())), top_logprobs=[])
        top = mx.argpartition(-logprobs, kth=self.k - 1)[:self.k]
        values = logprobs[mx.concatenate([mx.array([token], dtype=top.dtype), top])]
        mx.eval(top, values)
        vals = cast("list[float]", values.tolist())
        return self.ranked(token, vals[0], cast("list[int]", top.tolist()), vals[1:])


def legacy_block(entries: list[dict[str, Any]],
                 offset: int = 0) -> tuple[dict[str, Any], int]:
    """Entries in the legacy Completions shape (``tokens``, ``token_logprobs``,
    ``top_logprobs`` as ``{text: logprob}``, ``text_offset``), the entries themselves kept
    as ``content``; returns the block and the offset after its last token."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(offset)
        offset += len(e["token"])
        tokens.append(e["token"])
    tops = None
    if any(e["top_logprobs"] for e in entries):  # the prompt's first token: null, as OpenAI's
        tops = [None if e["logprob"] is None else _by_text(e["top_logprobs"]) for e in entries]
    return {"tokens": tokens, "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": tops, "text_offset": offsets, "content": entries}, offset


def _by_text(top: list[dict[str, Any]]) -> dict[str, float]:
    """The legacy ``{text: logprob}`` of one position: tokens that read alike (pieces of
    one character all read U+FFFD) share a key, which keeps the likeliest one's value, so
    the dict's largest value is still the position's best (lm-eval's greedy check)."""
    out: dict[str, float] = {}
    for t in top:  # sorted, likeliest first
        out.setdefault(t["token"], t["logprob"])
    return out
