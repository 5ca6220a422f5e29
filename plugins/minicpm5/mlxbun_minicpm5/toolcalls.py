"""MiniCPM5 tool calls (mlx_lm/tool_parsers/minicpm5.py): no outer wrapper, one
``<function name="fn"><param name="p">value</param></function>`` block per call,
consecutive blocks for parallel calls. Values holding ``<``, ``&`` or newlines are
CDATA-wrapped and kept verbatim; plain values are stripped (as mlx-lm does)."""

from __future__ import annotations

import re

from mlxbun_core.grammar import structural as S
from mlxbun_core.grammar.schema import resolve
from mlxbun_core.toolcalls import Dialect, StreamingToolParser, ToolCall, make_call
from mlxbun_core.toolcalls.element_scan import ElementScanner
from mlxbun_core.toolcalls.grammar import (
    ArgMarkup,
    element_args,
    free_text,
    raw_string,
    tool_schemas,
)
from mlxbun_core.toolcalls.incremental import RawValue

_Q = r"(\"[^\"]*\"|'[^']*'|[^\s\"'<>]+)"
_FN = re.compile(r"<function\s+name\s*=\s*" + _Q + r"\s*>")
_PARAM = re.compile(r"<param\s+name\s*=\s*" + _Q + r"\s*>")
_CD_OPEN, _CD_CLOSE, _P_CLOSE = "<![CDATA[", "]]>", "</param>"


def _unquote(s: str) -> str:
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] and s[0] in "\"'" else s


def _value(body: str, j: int) -> tuple[str, int]:
    """The value starting at ``body[j]`` and the offset past its ``</param>``."""
    k = j
    while k < len(body) and body[k].isspace():
        k += 1
    if body.startswith(_CD_OPEN, k):
        parts = []
        while body.startswith(_CD_OPEN, k):  # "]]]]><![CDATA[>" splits are joined
            e = body.find(_CD_CLOSE, k + len(_CD_OPEN))
            if e < 0:
                parts.append(body[k + len(_CD_OPEN):])
                return "".join(parts), len(body)
            parts.append(body[k + len(_CD_OPEN):e])
            k = e + len(_CD_CLOSE)
        c = body.find(_P_CLOSE, k)
        return "".join(parts), (len(body) if c < 0 else c + len(_P_CLOSE))
    c = body.find(_P_CLOSE, j)
    return (body[j:] if c < 0 else body[j:c]).strip(), (len(body) if c < 0 else c + len(_P_CLOSE))


def parse_block(markup: str, tools: list | None) -> list[ToolCall] | None:
    m = _FN.match(markup)
    if not m:
        return None
    body = markup[m.end():]
    if body.endswith("</function>"):
        body = body[: -len("</function>")]
    args, i = {}, 0
    while pm := _PARAM.search(body, i):
        args[_unquote(pm.group(1))], i = _value(body, pm.end())
    name = _unquote(m.group(1)).strip()
    return [make_call(name, args, tools)] if name else None


def _cdata_needed(v: str) -> bool:
    return "<" in v or "&" in v or "\n" in v


def string_value(schema, root: dict) -> dict:
    """A string parameter as the template writes it: plain text, or CDATA when it
    holds ``<``, ``&`` or a line break; then ``</param>``."""
    s = resolve(schema, root)
    values = s.get("enum") if isinstance(s, dict) and isinstance(s.get("enum"), list) else None
    if values is not None:
        texts = [str(v) for v in values]
        return S.seq(S.alt(*[S.const(f"{_CD_OPEN}{v}{_CD_CLOSE}" if _cdata_needed(v) else v)
                             for v in texts]), S.const(_P_CLOSE))

    def text(limit):
        plain = S.regex(r"[^<&\n]*" if limit is None else r"[^<&\n]{0,%d}" % limit)
        return S.seq(S.alt(plain, S.seq(S.const(_CD_OPEN), free_text(_CD_CLOSE, limit))),
                     S.const(_P_CLOSE))

    return raw_string(schema, root, _P_CLOSE, text=text)


def _name_of(q: str) -> str:
    return _unquote(q).strip()


class MiniCPM5Scanner(ElementScanner):
    """A plain value streams stripped; a CDATA value streams verbatim up to ``]]>``, and
    ends there only when ``</param>`` follows (a split ``]]]]><![CDATA[>`` is left to
    the whole parse)."""

    def __init__(self) -> None:
        super().__init__(_FN, _PARAM, "<param", _P_CLOSE, trim="strip", clean=_name_of)
        self.cdata = False

    def reader(self, text: str, start: int) -> RawValue | None:
        k = start
        while k < len(text) and text[k].isspace():
            k += 1
        head = text[k:k + len(_CD_OPEN)]
        if head == _CD_OPEN:
            self.cdata = True
            return RawValue(k + len(_CD_OPEN), _CD_CLOSE)
        if _CD_OPEN.startswith(head):
            return None
        self.cdata = False
        return RawValue(start, _P_CLOSE, "strip")

    def after_value(self, text: str, end: int) -> int | None:
        if not self.cdata:
            return end
        rest = text[end:].lstrip()
        if rest.startswith(_P_CLOSE):
            return len(text) - len(rest) + len(_P_CLOSE)
        return None if _P_CLOSE.startswith(rest) else -1


class MiniCPM5Dialect(Dialect):
    starts = ("<function name=",)
    end = "</function>"
    _scan: tuple[bool, int] | None = None  # per-parser resume state for complete()

    def complete(self, buffer: str, since: int = 0) -> int | None:
        """First ``</function>`` outside CDATA (a CDATA value may hold any tag).

        Resumable: the scan state (inside CDATA or not, and where) is kept between
        calls for the same block, so long CDATA bodies stay linear."""
        if since == 0 or self._scan is None:
            self._scan = (False, len(self.starts[0]))
        in_cd, pos = self._scan
        while True:
            if in_cd:
                ce = buffer.find(_CD_CLOSE, pos)
                if ce < 0:
                    self._scan = (True, max(pos, len(buffer) - len(_CD_CLOSE) + 1))
                    return None
                in_cd, pos = False, ce + len(_CD_CLOSE)
                continue
            e, c = buffer.find(self.end, pos), buffer.find(_CD_OPEN, pos)
            if c >= 0 and (e < 0 or c < e):
                in_cd, pos = True, c + len(_CD_OPEN)
                continue
            if e >= 0:
                self._scan = None
                return e + len(self.end)
            self._scan = (False, max(pos, len(buffer) - len(self.end) + 1))
            return None

    def parse(self, markup: str, tools: list | None) -> list[ToolCall] | None:
        return parse_block(markup, tools)

    def scanner(self) -> MiniCPM5Scanner:
        return MiniCPM5Scanner()

    def call_grammar(self, tools: list) -> dict:
        """``<function name="fn"><param name="p">value</param>…</function>``."""
        markup = ArgMarkup('<param name="', '">', _P_CLOSE, name_regex=r'[^"<>]+',
                           string=string_value)
        fns = [S.seq(S.const(f'"{name}">'), element_args(params, markup))
               for name, params in tool_schemas(tools)]
        return S.tag(self.starts[0], S.alt(*fns), self.end)


def make_parser(tools: list | None) -> StreamingToolParser:
    return StreamingToolParser(MiniCPM5Dialect(), tools)
