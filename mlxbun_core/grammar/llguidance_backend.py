"""llguidance backend (the default): fast mask computation, lazy lexer-based parsing,
no torch. ``guided_grammar`` takes Lark syntax (``start: ...``) or llama.cpp GBNF
(``root ::= ...``, converted with llguidance's own ``gbnf_to_lark``); regex is the
Rust ``regex`` syntax (``\\d``, ``.``, classes, repetition ``{m,n}`` all work;
``\\d``/``\\w`` are made ASCII to match xgrammar).
"""

from __future__ import annotations

import json

from ..hookspecs import hookimpl
from .base import CompiledGrammar, GrammarBackend, GrammarCompileError, eos_ids, hf_tokenizer
from .request import GrammarRequest

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


def _lark_literal(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


class LLGuidanceBackend(GrammarBackend):
    name = NAME

    def __init__(self, tokenizer):
        import llguidance.hf

        hf = hf_tokenizer(tokenizer)
        self.eos = tuple(eos_ids(tokenizer))
        self.vocab_size = len(hf)
        self.tok = llguidance.hf.from_tokenizer(hf, n_vocab=self.vocab_size,
                                                eos_token=list(self.eos) or None)

    def grammar(self, req: GrammarRequest) -> str:
        """llguidance's serialized grammar for ``req``."""
        from llguidance import LLMatcher, regex_to_lark
        from llguidance.gbnf_to_lark import any_to_lark

        if req.kind in ("json_schema", "json_object"):
            schema = req.value if req.kind == "json_schema" else {"type": "object"}
            over = None if req.any_whitespace else {"whitespace_flexible": False,
                                                    "item_separator": ",", "key_separator": ":"}
            return LLMatcher.grammar_from_json_schema(schema, overrides=over)
        if req.kind == "regex":
            # ASCII \d and \w, as in xgrammar and JSON Schema (Rust's are Unicode).
            return LLMatcher.grammar_from_regex(regex_to_lark(req.value, "dw"))
        if req.kind == "choice":
            return LLMatcher.grammar_from_lark(
                "start: " + " | ".join(_lark_literal(c) for c in req.value))
        try:
            lark = any_to_lark(req.value)
        except Exception as exc:
            raise GrammarCompileError(f"cannot convert GBNF grammar to Lark: {exc}") from None
        return LLMatcher.grammar_from_lark(lark)

    def compile(self, req: GrammarRequest) -> CompiledGrammar:
        from llguidance import LLMatcher

        try:
            g = self.grammar(req)
        except GrammarCompileError:
            raise
        except Exception as exc:
            raise GrammarCompileError(f"{type(exc).__name__}: {exc}") from None
        is_err, msgs = LLMatcher.validate_grammar_with_warnings(g, self.tok)
        if is_err:
            raise GrammarCompileError(msgs[0] if msgs else "invalid grammar")
        tok = self.tok

        def new_matcher():
            return _Matcher(LLMatcher(tok, g, log_level=0))

        return CompiledGrammar(NAME, req, self.vocab_size, self.eos, new_matcher)


@hookimpl
def register_grammar_backends(register):
    register(NAME, LLGuidanceBackend)
