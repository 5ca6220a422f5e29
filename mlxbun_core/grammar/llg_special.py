"""Added/special tokens on llguidance: a tokenizer whose mask and consume agree, and
a grammar rewrite that lets a special token's text be produced by that token.

Why: ``llguidance.hf.from_tokenizer`` marks every added token that is special *or*
merely shaped like ``<...>`` as a special token (0xFF-prefixed in the token trie, so
it never matches grammar text), but forced-text tokenization goes through the HF
tokenizer, which turns the text ``<tool_call>`` into that very added token. The mask
then allows only a token the parser rejects (``forced bytes: got '<'; applying
'\\xff'``). Fix, in two parts:

* :func:`build_tokenizer` builds the LLTokenizer from a token list instead:
  added tokens that HF does *not* flag special (Qwen's / GLM's ``<tool_call>``) are
  ordinary text tokens (their bytes are their text), and HF-special ones stay special;
  the tokenizer used for forced text (llguidance's own fixes: no Prepend normalizer,
  Metaspace ``prepend_scheme`` never) has ``encode_special_tokens`` on, so it never
  yields a special token for plain text. Mask and consume agree for every grammar.
* :class:`SpecialRewriter` turns literal occurrences of a special token's text in a
  regex / choice / Lark grammar into llguidance token references ``<[id]>``, so e.g.
  Gemma's ``<|tool_call>`` is produced by its single token (and only by it) - what the
  model emits natively, and what xgrammar allows. JSON Schema text is never rewritten:
  a JSON string containing a special token's text is spelled in text tokens. The
  regex / Lark scanning it relies on lives in :mod:`.grammar_text`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from copy import copy
from typing import Any

from .grammar_text import RegexParser, Unsupported, lark_tokens, unescape_guess

# ---------------------------------------------------------------- tokenizer

def _fix_normalizer(n):
    """llguidance's ByteTokenizer fix: drop Prepend normalizers (recursively)."""
    if not isinstance(n, dict):
        return n
    if n.get("type") == "Prepend":
        return None
    if n.get("type") == "Sequence":
        kept = [m for m in (_fix_normalizer(x) for x in n.get("normalizers", [])) if m is not None]
        return dict(n, normalizers=kept) if kept else None
    return n


def _fix_pretokenizer(p):
    """llguidance's ByteTokenizer fix: Metaspace never prepends a space."""
    if not isinstance(p, dict):
        return p
    if p.get("type") == "Metaspace":
        p = dict(p, prepend_scheme="never")
        if "add_prefix_space" in p:
            p["add_prefix_space"] = False
        return p
    if p.get("type") == "Sequence":
        return dict(p, pretokenizers=[_fix_pretokenizer(x) for x in p.get("pretokenizers", [])])
    return p


class _TokenizerWrapper:
    """What ``llguidance.LLTokenizer`` takes besides a tokenizer.json string."""

    is_tokenizer_wrapper = True

    def __init__(self, tokens, special_ids, eos, bos, encoder):
        self.tokens = tokens
        self.special_token_ids = special_ids
        self.eos_token_id = eos
        self.bos_token_id = bos
        self._encoder = encoder

    def __call__(self, s):
        if isinstance(s, (bytes, bytearray)):
            s = bytes(s).decode("utf-8", errors="replace")
        return self._encoder.encode(s, add_special_tokens=False).ids


def build_tokenizer(hf, n_vocab: int, eos: list[int]):
    """``(LLTokenizer, specials)`` for an HF fast tokenizer; ``specials`` maps the text
    of each special token (HF ``special: true``, not EOS) to its id."""
    import llguidance.hf
    from llguidance import LLTokenizer
    from tokenizers import Tokenizer

    # llguidance's own byte decoding of every token (byte-level, byte-fallback, ...).
    base = _with_eos(lambda e: llguidance.hf.from_tokenizer(hf, n_vocab=n_vocab, eos_token=e), eos)
    bt = copy(hf.backend_tokenizer)
    bt.no_padding()
    bt.no_truncation()
    spec = json.loads(bt.to_str())
    spec["normalizer"] = _fix_normalizer(spec.get("normalizer"))
    spec["pre_tokenizer"] = _fix_pretokenizer(spec.get("pre_tokenizer"))
    encoder = Tokenizer.from_str(json.dumps(spec))
    encoder.encode_special_tokens = True     # text never becomes a special token

    tokens = [base.decode_bytes([i]) for i in range(n_vocab)]
    special_ids: list[int] = []
    specials: dict[str, int] = {}
    for t in spec.get("added_tokens") or []:
        i, content = t.get("id"), t.get("content") or ""
        if not isinstance(i, int) or not 0 <= i < n_vocab:
            continue
        if t.get("special"):
            special_ids.append(i)
            if content and i not in eos:
                specials.setdefault(content, i)
        else:
            tokens[i] = content.encode("utf-8")   # plain text, whatever its shape
    eos_id = eos[0] if eos else base.eos_token
    bos_id = getattr(hf, "bos_token_id", None)
    wrapper = _TokenizerWrapper(tokens, special_ids, eos_id, bos_id, encoder)
    # llguidance annotates its own wrapper class; LLTokenizer reads only what ours has
    return _with_eos(lambda e: LLTokenizer(wrapper, n_vocab=n_vocab,  # type: ignore[arg-type]
                                           eos_token=e), eos), specials


def _with_eos(make, eos: list[int]):
    """llguidance >= 1.7 takes every EOS id; older releases take one (the mask still
    allows the others: GrammarProcessor sets all EOS bits where the grammar accepts)."""
    try:
        return make(list(eos) or None)
    except TypeError:
        return make(eos[0] if eos else None)


# ---------------------------------------------------------------- rewriting

class SpecialRewriter:
    """Rewrites grammar text so a special token's literal text is that token."""

    def __init__(self, specials: dict[str, int]):
        self.specials = {s: i for s, i in specials.items() if s}
        self._pat = (re.compile("|".join(re.escape(s) for s in
                                         sorted(self.specials, key=len, reverse=True)))
                     if self.specials else None)

    def __bool__(self):
        return self._pat is not None

    # -- helpers
    def split(self, text: str):
        """[(str_or_None, token_id_or_None)] pieces; None if no occurrence."""
        if self._pat is None:
            return None
        out: list[tuple[str | None, int | None]] = []
        pos = 0
        for m in self._pat.finditer(text):
            if m.start() > pos:
                out.append((text[pos:m.start()], None))
            out.append((None, self.specials[m.group(0)]))
            pos = m.end()
        if not out:
            return None
        if pos < len(text):
            out.append((text[pos:], None))
        return out

    def literal(self, text: str) -> str | None:
        """Lark expression for the literal ``text``, or None when it has no special."""
        pieces = self.split(text)
        if pieces is None:
            return None
        return "(" + " ".join(json.dumps(s, ensure_ascii=False) if s is not None else f"<[{t}]>"
                              for s, t in pieces) + ")"

    def choice(self, options: list[str]) -> str:
        """Lark body for a choice between literal strings."""
        return " | ".join(self.literal(o) or json.dumps(o, ensure_ascii=False) for o in options)

    # -- regex
    def regex(self, pattern: str, use_ascii: str = "dw") -> str | None:
        """Lark expression matching ``pattern`` with special texts as tokens, or None
        (no occurrence, or syntax this rewriter does not follow: keep it as text)."""
        if self._pat is None or not self._pat.search(unescape_guess(pattern)):
            return None
        try:
            alt = RegexParser(pattern).parse()
        except Unsupported:
            return None
        from llguidance import regex_to_lark

        def rx(src):
            return "/" + regex_to_lark(src, use_ascii) + "/"

        out = _RegexRewrite(self._pat, self.specials, pattern, rx).alt(alt)
        return None if out is None else "(" + out + ")"

    # -- lark
    def lark(self, text: str) -> str | None:
        """``text`` (Lark) with special texts in rule strings/regexes as tokens; terminals
        that contain one become rules. None when nothing changes or on doubt."""
        if self._pat is None or not self._pat.search(unescape_guess(text)):
            return None
        try:
            return self._lark(text)
        except Unsupported:
            return None

    def _lark(self, text):
        """Converted terminals renamed into rules, and the special texts in every rule's
        strings and regexes made tokens; None when nothing changes."""
        toks = lark_tokens(text)
        defs = _definitions(toks)
        convert = self._terminals_to_convert(toks, defs)
        rename = _new_names(toks, defs, convert)
        out = [v if k != "header" else v[0] for k, v in toks]
        changed = False
        for d in defs:
            if d[0] == "terminal" and d[1] in rename:
                out[d[2]] = toks[d[2]][1][0].replace(d[1], rename[d[1]], 1)
                d[0] = "rule"
                changed = True
            for i in d[3]:
                kind, val = toks[i]
                if kind == "ident" and val in rename:
                    out[i] = rename[val]
                    changed = True
                elif d[0] == "rule" and kind in ("string", "regex"):
                    new = (self._string_rewrite(val) if kind == "string"
                           else self._regex_tok_rewrite(val))
                    if new is not None:
                        out[i] = new
                        changed = True
        return "".join(out) if changed else None

    def _terminals_to_convert(self, toks, defs) -> set[str]:
        """The terminals that must become rules: those with a special text in a string or
        regex, then those using one of them (a directive may not use one: Unsupported)."""
        def has_special(idx):
            kind, val = toks[idx]
            if kind == "string":
                return self._string_rewrite(val) is not None
            if kind == "regex":
                return self._regex_tok_rewrite(val) is not None
            return False

        convert = {d[1] for d in defs if d[0] == "terminal" and any(has_special(i) for i in d[3])}
        grew = True
        while grew:                       # terminals using converted ones become rules too
            grew = False
            for d in defs:
                if d[0] == "terminal" and d[1] not in convert and any(
                        toks[i][0] == "ident" and toks[i][1] in convert for i in d[3]):
                    convert.add(d[1])
                    grew = True
        if convert and any(toks[i][0] == "ident" and toks[i][1] in convert
                           for d in defs if d[0] == "directive" for i in d[3]):
            raise Unsupported("converted terminal used by a directive")
        return convert

    def _string_rewrite(self, tok: str) -> str | None:
        if not tok.endswith('"'):         # "..."i: case-insensitive, leave as text
            return None
        try:
            s = json.loads(tok)
        except ValueError:
            return None
        return self.literal(s) if isinstance(s, str) else None

    def _regex_tok_rewrite(self, tok: str) -> str | None:
        if not tok.endswith("/"):         # /.../flags: leave as text
            return None
        return self.regex(tok[1:-1], use_ascii="")


# ---------------------------------------------------------------- rewriting: pieces

def _definitions(toks) -> list:
    """The Lark tokens' definitions, in order: ``[kind, name, header index, body token
    indices]`` with kind terminal, rule or directive (name: the directive's text)."""
    defs, cur = [], None
    for idx, (kind, val) in enumerate(toks):
        if kind == "header":
            name = val[1]
            cur = ["terminal" if name.lstrip("?!_")[:1].isupper() else "rule", name, idx, []]
            defs.append(cur)
        elif kind == "directive":
            cur = ["directive", val, idx, []]
            defs.append(cur)
        elif cur is not None:
            cur[3].append(idx)
    return defs


def _new_names(toks, defs, convert: set[str]) -> dict[str, str]:
    """A rule name for each terminal in ``convert``, unused in the grammar."""
    used = {v for k, v in toks if k == "ident"} | {d[1] for d in defs}
    rename = {}
    for name in sorted(convert):
        new = "llg_special_" + name.lower()
        while new in used:
            new += "_"
        used.add(new)
        rename[name] = new
    return rename


_Item = tuple[str, Any, int, int, str]  # RegexParser's (kind, data, start, end, quant)


class _RegexRewrite:
    """Lark text for a parsed regex (:class:`RegexParser` items) in which each special
    token's literal text is that token; the rest stays regex text, in ``/.../`` pieces."""

    def __init__(self, pat: re.Pattern[str], specials: dict[str, int], pattern: str,
                 rx: Callable[[str], str]) -> None:
        self.pat, self.specials, self.pattern, self.rx = pat, specials, pattern, rx

    def alt(self, branches: list[list[_Item]]) -> str | None:
        """Alternatives joined by ``|``; None when no branch changed."""
        outs = [self.seq(b) for b in branches]
        if not any(changed for _, changed in outs):
            return None
        return " | ".join(e for e, _ in outs)

    def seq(self, seq: list[_Item]) -> tuple[str, bool]:
        """``(Lark text, changed)`` for one branch's items."""
        out = _Pieces(self.rx)
        k = 0
        while k < len(seq):
            kind, data, start, end, quant = seq[k]
            if kind == "lit" and not quant:
                k = self._literal_run(seq, k, out)
                continue
            if kind == "group":
                inner = self.alt(data)
                if inner is not None:
                    # a lazy quantifier: the same language
                    q = quant[:-1] if len(quant) > 1 and quant.endswith("?") else quant
                    out.expr("(" + inner + ")" + q)
                    k += 1
                    continue
            out.text(self.pattern[start:end])
            k += 1
        return out.close()

    def _literal_run(self, seq: list[_Item], k: int, out: _Pieces) -> int:
        """The unquantified literals from ``seq[k]`` on, special texts among them as
        token references; the index after the run."""
        run: list[_Item] = []
        while k < len(seq) and seq[k][0] == "lit" and not seq[k][4]:
            run.append(seq[k])
            k += 1
        text = "".join(r[1] for r in run)
        pos = 0
        for m in self.pat.finditer(text):
            out.text(*(self.pattern[r[2]:r[3]] for r in run[pos:m.start()]))
            out.expr(f"<[{self.specials[m.group(0)]}]>")
            pos = m.end()
        out.text(*(self.pattern[r[2]:r[3]] for r in run[pos:]))
        return k


class _Pieces:
    """One sequence's Lark pieces: consecutive regex text gathers into one ``/.../``."""

    def __init__(self, rx: Callable[[str], str]) -> None:
        self.rx = rx
        self.parts: list[str] = []
        self.pending: list[str] = []
        self.changed = False

    def text(self, *srcs: str) -> None:
        self.pending.extend(srcs)

    def expr(self, lark: str) -> None:
        """A rewritten piece (a token reference, a changed group)."""
        self._flush()
        self.parts.append(lark)
        self.changed = True

    def close(self) -> tuple[str, bool]:
        self._flush()
        return (" ".join(self.parts) if self.parts else '""'), self.changed

    def _flush(self) -> None:
        if self.pending:
            self.parts.append(self.rx("".join(self.pending)))
            self.pending.clear()
