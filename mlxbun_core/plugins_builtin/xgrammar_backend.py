"""xgrammar backend (optional: ``pip install xgrammar``; on Linux it pulls torch).

``guided_grammar`` takes xgrammar's GBNF-like EBNF (``root ::= ...``); a grammar
without ``::=`` is treated as Lark (``start: ...``) and goes through xgrammar's Lark
front-end, so the same grammar text works on both backends. Regex uses xgrammar's
native regex compiler (``compile_regex``). Import is lazy: the module registers
nothing when xgrammar is missing, and ``AVAILABLE`` says so.
"""

from __future__ import annotations

import importlib.util
import json
import os
from typing import Any

from ..contract import GrammarBackend
from ..grammar.base import CompiledGrammar, GrammarCompileError, eos_ids, hf_tokenizer
from ..grammar.budget import ByteVocab
from ..grammar.request import SEPARATORS, GrammarRequest
from ..grammar.schema import closed
from ..grammar.structural import map_json
from ..hookspecs import hookimpl
from ..runconfig import current

NAME = "xgrammar"
AVAILABLE = importlib.util.find_spec("xgrammar") is not None


class _Matcher:
    __slots__ = ("m", "_err")

    def __init__(self, m):
        self.m = m
        self._err = None

    def consume(self, ids):
        for t in ids:
            if self.m.is_terminated():      # EOS already taken; extra tokens are harmless
                return True
            if not self.m.accept_token(t):
                self._err = f"token {t} rejected"
                return False
        return True

    def fill(self, bits):
        self.m.fill_next_token_bitmask(bits.reshape(1, -1))

    def error(self):
        return self._err

    def fork(self):
        return _Matcher(self.m.fork())

    def try_token(self, t):
        return self.m.accept_token(t)   # a rejected token leaves the state as it was

    def accepting(self):
        return self.m.is_completed()

    def rollback(self, n):
        self.m.rollback(n)


# xgrammar <=0.2.9 lowers minLength/maxLength strings to a bare class that admits raw
# U+0000-U+001F (invalid JSON) and no escapes (mlc-ai/xgrammar#800). Patch the EBNF.
_BAD_CHAR = r'[^\"\\\r\n]'
_JSON_CHAR = (r'xjson_char ::= [^\0-\x1f\"\\] | "\\" ([\"\\/bfnrt] | "u" [A-Fa-f0-9] '
              r'[A-Fa-f0-9] [A-Fa-f0-9] [A-Fa-f0-9])')


def _patched(g: str) -> str:
    if _BAD_CHAR in g:
        g = g.replace(_BAD_CHAR, "xjson_char") + "\n" + _JSON_CHAR + "\n"
    return _no_surrogates(g)


def _no_surrogates(g: str) -> str:
    """Negated classes (``[^<]``) in xgrammar admit U+D800-U+DFFF, whose UTF-8 form is
    invalid (it decodes to replacement characters): exclude them, outside literals."""
    out, i, n = [], 0, len(g)
    while i < n:
        c = g[i]
        if c == '"':
            j = i + 1
            while j < n and g[j] != '"':
                j += 2 if g[j] == "\\" else 1
            out.append(g[i:j + 1])
            i = j + 1
        elif g.startswith("[^", i):
            out.append("[^\\uD800-\\uDFFF")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _json_schema_ebnf(schema, whitespace: str) -> str:
    import xgrammar as xgr

    kw: dict[str, Any] = ({"any_whitespace": False, "separators": SEPARATORS[whitespace]}
          if whitespace in SEPARATORS else {})
    schema = closed(schema)
    return _patched(str(xgr.Grammar.from_json_schema(json.dumps(schema), strict_mode=True, **kw)))


def _structural_ebnf(fmt: dict, whitespace: str) -> str:
    """A structural format through xgrammar's own structural tags; JSON parts closed
    and laid out like a json_schema request (an exact layout: the JSON part is xgrammar's
    own JSON grammar for it, embedded)."""
    import xgrammar as xgr

    def prepared(node):
        if whitespace in SEPARATORS:
            return {"type": "grammar",
                    "grammar": _json_schema_ebnf(node["json_schema"], whitespace)}
        return dict(node, json_schema=closed(node["json_schema"]))

    tag = {"type": "structural_tag", "format": map_json(fmt, prepared)}
    return _patched(str(xgr.Grammar.from_structural_tag(json.dumps(tag))))


def _gbnf_literal(s: str) -> str:
    # GBNF string escapes are JSON's (\" \\ \n \uXXXX).
    return json.dumps(s, ensure_ascii=True)


class XGrammarBackend(GrammarBackend):
    name = NAME

    def __init__(self, tokenizer):
        import xgrammar as xgr

        hf = hf_tokenizer(tokenizer)
        self.eos = tuple(eos_ids(tokenizer))
        self.vocab_size = len(hf)
        info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=self.vocab_size,
                                                  stop_token_ids=list(self.eos) or None)
        self.vocab = byte_vocab(info, hf, self.vocab_size)
        threads = current().grammar.threads or min(8, os.cpu_count() or 1)
        # Our registry caches compiled grammars; xgrammar's own cache would double it.
        self.compiler = xgr.GrammarCompiler(info, max_threads=threads, cache_enabled=False)

    def _compile(self, req: GrammarRequest):
        c = self.compiler
        if req.kind in ("json_schema", "json_object"):
            schema = req.value if req.kind == "json_schema" else {"type": "object"}
            return c.compile_grammar(_json_schema_ebnf(schema, req.whitespace))
        if req.kind == "structural":
            return c.compile_grammar(_structural_ebnf(req.value["format"], req.whitespace))
        if req.kind == "regex":
            import xgrammar as xgr

            return c.compile_grammar(_patched(str(xgr.Grammar.from_regex(req.value))))
        if req.kind == "choice":
            return c.compile_grammar("root ::= " + " | ".join(_gbnf_literal(x) for x in req.value))
        if "::=" in req.value:
            return c.compile_grammar(req.value)
        return c.compile_lark(req.value)

    def compile(self, req: GrammarRequest) -> CompiledGrammar:
        import xgrammar as xgr

        try:
            cg = self._compile(req)
        except Exception as exc:
            raise GrammarCompileError(f"{type(exc).__name__}: {exc}") from None

        def new_matcher():
            return _Matcher(xgr.GrammarMatcher(cg))

        return CompiledGrammar(NAME, req, self.vocab_size, self.eos, new_matcher, self.vocab)


def byte_vocab(info, hf, vocab_size: int) -> ByteVocab:
    """The budget-aware close's view of a TokenizerInfo (see :class:`ByteVocab`)."""
    import numpy as np

    decoded = info.decoded_vocab
    special = set(info.special_token_ids)
    one: dict[int, int] = {}
    for i, b in enumerate(decoded[:vocab_size]):
        if len(b) == 1 and i not in special:
            one.setdefault(b[0], i)
    lengths = np.array([len(b) for b in decoded[:vocab_size]])

    def encode(data: bytes) -> list:
        return hf.encode(data.decode("utf-8"), add_special_tokens=False)

    return ByteVocab(one, encode, lambda: lengths)


if AVAILABLE:
    @hookimpl
    def register_grammar_backends(register):
        register(NAME, XGrammarBackend)
