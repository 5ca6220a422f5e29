"""llguidance backend (the default): fast mask computation, lazy lexer-based parsing,
no torch. ``guided_grammar`` takes Lark syntax (``start: ...``) or llama.cpp GBNF
(``root ::= ...``, converted with llguidance's own ``gbnf_to_lark``); regex is the
Rust ``regex`` syntax (``\\d``, ``.``, classes, repetition ``{m,n}`` all work;
``\\d``/``\\w`` are made ASCII to match xgrammar).

Added tokens: see :mod:`mlxbun_core.grammar.llg_special` - non-special added tokens
(``<tool_call>`` on Qwen/GLM) are text tokens; a special token's text spelled in a regex /
choice / Lark grammar is that single token (Gemma's ``<|tool_call>``); mask and consume
always agree.
"""

from __future__ import annotations

import numpy as np

from ..contract import GrammarBackend
from ..grammar.base import CompiledGrammar, GrammarCompileError, eos_ids, hf_tokenizer
from ..grammar.budget import ByteVocab
from ..grammar.llg_special import SpecialRewriter, build_tokenizer
from ..grammar.request import GrammarRequest
from ..grammar.schema import closed
from ..grammar.structural_lark import LarkWriter, json_options
from ..hookspecs import hookimpl

NAME = "llguidance"


class _Matcher:
    __slots__ = ("m",)

    def __init__(self, m):
        self.m = m

    def consume(self, ids):
        return self.m.consume_tokens(ids)

    def fill(self, bits):
        self.m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)

    def error(self):
        return self.m.get_error() if self.m.is_error() else None

    def fork(self):
        return _Matcher(self.m.deep_copy())

    def try_token(self, t):
        return self.m.try_consume_tokens([t]) == 1

    def accepting(self):
        return self.m.is_accepting()

    def rollback(self, n):
        self.m.rollback(n)


class LLGuidanceBackend(GrammarBackend):
    name = NAME

    def __init__(self, tokenizer):
        hf = hf_tokenizer(tokenizer)
        self.eos = tuple(eos_ids(tokenizer))
        self.vocab_size = len(hf)
        self.tok, specials = build_tokenizer(hf, self.vocab_size, list(self.eos))
        self.rewriter = SpecialRewriter(specials)
        self.vocab = byte_vocab(self.tok, self.vocab_size)

    def grammar(self, req: GrammarRequest, special: bool = True) -> str:
        """llguidance's serialized grammar for ``req``; ``special``: spell special
        tokens' text in regex / choice / Lark as the tokens themselves."""
        from llguidance import LLMatcher, regex_to_lark
        from llguidance.gbnf_to_lark import any_to_lark

        rw = self.rewriter if special else SpecialRewriter({})

        if req.kind in ("json_schema", "json_object"):
            schema = closed(req.value) if req.kind == "json_schema" else {"type": "object"}
            return LLMatcher.grammar_from_json_schema(
                schema, overrides=json_options(req.whitespace))
        if req.kind == "structural":
            writer = LarkWriter(rw, req.whitespace)
            return LLMatcher.grammar_from_lark(writer.grammar(req.value["format"]))
        if req.kind == "regex":
            # ASCII \d and \w, as in xgrammar and JSON Schema (Rust's are Unicode).
            expr = rw.regex(req.value, "dw")
            if expr is not None:
                return LLMatcher.grammar_from_lark("start: " + expr)
            return LLMatcher.grammar_from_regex(regex_to_lark(req.value, "dw"))
        if req.kind == "choice":
            return LLMatcher.grammar_from_lark("start: " + rw.choice(req.value))
        try:
            lark = any_to_lark(req.value)
        except Exception as exc:
            raise GrammarCompileError(f"cannot convert GBNF grammar to Lark: {exc}") from None
        return LLMatcher.grammar_from_lark(rw.lark(lark) or lark)

    def compile(self, req: GrammarRequest) -> CompiledGrammar:
        from llguidance import LLMatcher

        g = self._validated(req, special=True)
        if isinstance(g, GrammarCompileError) and self.rewriter:
            # The special-token rewrite is an improvement, never a requirement: without
            # it special tokens' text is spelled in text tokens (still consistent).
            g = self._validated(req, special=False)
        if isinstance(g, GrammarCompileError):
            raise g
        tok = self.tok

        def new_matcher():
            return _Matcher(LLMatcher(tok, g, log_level=0))

        return CompiledGrammar(NAME, req, self.vocab_size, self.eos, new_matcher, self.vocab)

    def _validated(self, req: GrammarRequest, special: bool):
        """The grammar for ``req``, or the GrammarCompileError saying why not."""
        from llguidance import LLMatcher

        try:
            g = self.grammar(req, special)
        except GrammarCompileError as exc:
            return exc
        except Exception as exc:
            return GrammarCompileError(f"{type(exc).__name__}: {exc}")
        is_err, msgs = LLMatcher.validate_grammar_with_warnings(g, self.tok)
        if is_err:
            return GrammarCompileError(msgs[0] if msgs else "invalid grammar")
        return g


def byte_vocab(tok, vocab_size: int) -> ByteVocab:
    """The budget-aware close's view of an LLTokenizer (see :class:`ByteVocab`)."""
    one = {}
    for b in range(256):
        ids = tok.tokenize_bytes(bytes([b]))
        if len(ids) == 1 and ids[0] < vocab_size and tok.decode_bytes(ids) == bytes([b]):
            one[b] = ids[0]
    lengths: list[int] = []

    def token_lengths():
        if not lengths:
            lengths.append(np.array([len(tok.decode_bytes([i])) for i in range(vocab_size)]))
        return lengths[0]

    return ByteVocab(one, tok.tokenize_bytes, token_lengths)


@hookimpl
def register_grammar_backends(register):
    register(NAME, LLGuidanceBackend)
