"""Just enough grammar-text syntax to find literal text in it: a Rust ``regex``
item parser (:class:`RegexParser`) and a Lark tokenizer (:func:`lark_tokens`).

Used by :class:`~.llg_special.SpecialRewriter`; anything these scanners do not
follow raises :class:`Unsupported`, and the caller then keeps the text as it is.
"""

from __future__ import annotations

import re
from typing import Any


class Unsupported(Exception):
    """Syntax these scanners do not follow: leave the grammar text unchanged."""


# ---------------------------------------------------------------- regex


_SIMPLE_ESC = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_QUANT = re.compile(r"\{(\d+)(,(\d*))?\}")
_HEX = re.compile(r"[0-9A-Fa-f]+")


class RegexParser:
    """Just enough of Rust ``regex`` syntax to find literal text: items are
    ``(kind, data, start, end)`` with kind lit (data: the char), other, or group
    (data: list of branches); ``end`` includes the item's quantifier, kept in quant."""

    def __init__(self, p: str):
        self.p = p
        self.i = 0

    def parse(self):
        alt = self._alt(0)
        if self.i != len(self.p):
            raise Unsupported("unbalanced ')'")
        return alt

    def _alt(self, depth):
        p = self.p
        branches, seq = [], []
        while self.i < len(p):
            c = p[self.i]
            if c == "|":
                branches.append(seq)
                seq = []
                self.i += 1
                continue
            if c == ")":
                if depth == 0:
                    raise Unsupported("unbalanced ')'")
                break
            start = self.i
            if c == "(":
                if p.startswith("(?:", self.i):
                    self.i += 3
                elif p.startswith("(?P<", self.i) or (p.startswith("(?<", self.i)
                                                      and not p.startswith("(?<=", self.i)
                                                      and not p.startswith("(?<!", self.i)):
                    j = p.find(">", self.i)
                    if j < 0:
                        raise Unsupported("bad group name")
                    self.i = j + 1
                elif p.startswith("(?", self.i):
                    raise Unsupported("inline flags / lookaround")
                else:
                    self.i += 1
                inner = self._alt(depth + 1)
                if self.i >= len(p) or p[self.i] != ")":
                    raise Unsupported("unbalanced '('")
                self.i += 1
                item = ["group", inner, start]
            elif c == "[":
                self._class()
                item = ["other", None, start]
            elif c == "\\":
                item = self._escape(start)
            elif c in ".^$":
                self.i += 1
                item = ["other", None, start]
            elif c in "*+?" or (c == "{" and _QUANT.match(p, self.i)):
                raise Unsupported("dangling quantifier")
            else:
                self.i += 1
                item = ["lit", c, start]
            quant = self._quant()
            seq.append((item[0], item[1], item[2], self.i, quant))
        branches.append(seq)
        return branches

    def _quant(self):
        p, q = self.p, ""
        while self.i < len(p):
            c = p[self.i]
            m = _QUANT.match(p, self.i) if c == "{" else None
            if c in "*+?":
                q += c
                self.i += 1
            elif m:
                q += m.group(0)
                self.i = m.end()
            else:
                break
        return q

    def _class(self):
        p = self.p
        self.i += 1
        if self.i < len(p) and p[self.i] == "^":
            self.i += 1
        if self.i < len(p) and p[self.i] == "]":
            self.i += 1
        while self.i < len(p):
            c = p[self.i]
            if c == "\\":
                self.i += 2
            elif c == "[":
                if p.startswith("[:", self.i):
                    j = p.find(":]", self.i + 2)
                    if j < 0:
                        raise Unsupported("bad class")
                    self.i = j + 2
                else:
                    self._class()
            elif c == "]":
                self.i += 1
                return
            else:
                self.i += 1
        raise Unsupported("unclosed class")

    def _escape(self, start):
        p = self.p
        if self.i + 1 >= len(p):
            raise Unsupported("trailing backslash")
        e = p[self.i + 1]
        self.i += 2
        if e in _SIMPLE_ESC:
            return ["lit", _SIMPLE_ESC[e], start]
        if e in "xuU":
            if self.i < len(p) and p[self.i] == "{":
                j = p.find("}", self.i)
                digits = p[self.i + 1:j] if j > 0 else ""
                if not _HEX.fullmatch(digits):
                    raise Unsupported("bad hex escape")
                self.i = j + 1
            else:
                n = {"x": 2, "u": 4, "U": 8}[e]
                digits = p[self.i:self.i + n]
                if len(digits) != n or not _HEX.fullmatch(digits):
                    raise Unsupported("bad hex escape")
                self.i += n
            return ["lit", chr(int(digits, 16)), start]
        if e in "pP":
            if self.i < len(p) and p[self.i] == "{":
                j = p.find("}", self.i)
                if j < 0:
                    raise Unsupported("bad class name")
                self.i = j + 1
            else:
                self.i += 1
            return ["other", None, start]
        if e.isalnum() or e == "_":       # \d \w \s \b \A \z ... (and unknowns)
            return ["other", None, start]
        return ["lit", e, start]          # escaped punctuation / space


# ---------------------------------------------------------------- lark

def unescape_guess(text: str) -> str:
    """Cheap pre-check text: drop backslashes so ``<\\|tool_call>`` finds ``<|tool_call>``."""
    return text.replace("\\", "")


_HEADER = re.compile(r"[ \t]*([?!]?[_a-zA-Z][_a-zA-Z0-9]*)(\[[^\]\n]*\])?(\.-?\d+)?[ \t]*:(?!:)")
_IDENT = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")
_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"i?')
_REGEX = re.compile(r"/(?:[^/\\\n]|\\.)+/[imslux]*")
_DIRECTIVE = re.compile(r"[ \t]*%[a-zA-Z_]+")
_GRAMMAR_REF = re.compile(r"@[_a-zA-Z0-9]+")


def _directive_body(text: str, i: int, toks: list) -> int:
    """After a ``%directive``: keep an optional ``{...}`` body whole; return the new index."""
    j = i
    while j < len(text) and text[j] in " \t":
        j += 1
    if j < len(text) and text[j] == "{":
        end = _skip_braces(text, j)
        toks.append(("other", text[i:end]))
        return end
    return i


def _skip_braces(text: str, i: int) -> int:
    """Index after the balanced ``{...}`` starting at ``text[i] == '{'`` (JSON-aware)."""
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == '"':
            m = _STRING.match(text, i)
            if not m:
                raise Unsupported("bad string in braces")
            i = m.end()
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise Unsupported("unbalanced braces")


def lark_tokens(text: str):
    """Lark text as [(kind, value)], kinds: header (value: (text, name)), directive,
    string, regex, ident, other. Joining the texts gives ``text`` back."""
    toks: list[tuple[str, Any]] = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        if line_start:
            line_start = False
            j = _line_head(text, i, toks)
            if j is not None:
                i = j
                continue
        if text[i] == "\n":
            toks.append(("other", "\n"))
            line_start = True
            i += 1
        else:
            i = _token(text, i, toks)
    return toks


def _line_head(text: str, i: int, toks: list) -> int | None:
    """At a line's start: a rule/terminal header or a ``%directive`` (appended to ``toks``;
    the index after it), or None when the line starts with neither."""
    m = _HEADER.match(text, i)
    if m:
        toks.append(("header", (m.group(0), m.group(1))))
        return m.end()
    m = _DIRECTIVE.match(text, i)
    if m:
        toks.append(("directive", m.group(0)))
        return _directive_body(text, m.end(), toks)
    return None


def _token(text: str, i: int, toks: list) -> int:
    """The one token at ``text[i]`` (not a newline) appended to ``toks``; the index after it."""
    c = text[i]
    if text.startswith("//", i):
        j = text.find("\n", i)
        j = len(text) if j < 0 else j
        toks.append(("other", text[i:j]))
        return j
    if c == '"':
        m = _STRING.match(text, i)
        if not m:
            raise Unsupported("bad string")
        toks.append(("string", m.group(0)))
        return m.end()
    if c == "/":
        m = _REGEX.match(text, i)
        if not m:
            raise Unsupported("bad regex")
        toks.append(("regex", m.group(0)))
        return m.end()
    if c == "<":
        j = text.find(">", i)
        if j < 0:
            raise Unsupported("bad special token")
        toks.append(("other", text[i:j + 1]))
        return j + 1
    if c == "%":
        m = _DIRECTIVE.match(text, i)
        if not m:
            raise Unsupported("bad directive")
        toks.append(("other", m.group(0)))     # e.g. inline %json {...}
        return _directive_body(text, m.end(), toks)
    if c == "@":
        m = _GRAMMAR_REF.match(text, i)
        toks.append(("other", m.group(0) if m else c))
        return i + (len(m.group(0)) if m else 1)
    m = _IDENT.match(text, i)
    if m:
        toks.append(("ident", m.group(0)))
        return m.end()
    toks.append(("other", c))
    return i + 1
