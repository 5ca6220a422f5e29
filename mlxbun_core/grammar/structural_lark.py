"""Structural formats (:mod:`.structural`) as llguidance Lark.

JSON parts become inline ``%json {...}`` rules carrying the request's whitespace
options; free text up to a plain-text end is one lazy lexeme (it ends at the first
occurrence of the end, as the dialect parsers read it); an end or trigger that is a
special token follows a greedy text lexeme (text never contains a special token).
Free text between triggered tags excludes every trigger, so a trigger always opens
a constrained tag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import TypedDict

from .request import SEPARATORS
from .schema import closed

TEXT_ALL = r"(?s:.*)"


class JsonOptions(TypedDict, total=False):
    """llguidance's JSON compile options, a plain dict its ``grammar_from_json_schema``
    takes. llguidance declares their type (``JsonCompileOptions``) only in its private
    ``_lib`` stub, so the keys are spelled out here as it types them; mypy checks this
    against its declaration where the options are passed."""

    item_separator: str | None
    key_separator: str | None
    whitespace_pattern: str | None
    whitespace_flexible: bool | None
    coerce_one_of: bool | None
    lenient: bool | None
    json_allowed_escapes: str | None
    json_allow_general_unicode_escapes: bool | None


def json_options(whitespace: str) -> JsonOptions:
    """llguidance JSON compile options for a whitespace mode of :class:`GrammarRequest`."""
    if whitespace in SEPARATORS:
        item, key = SEPARATORS[whitespace]
        return {"whitespace_flexible": False, "item_separator": item, "key_separator": key}
    return {"whitespace_flexible": True}


class LarkWriter:
    """Compiles one format into Lark text; ``rw`` is the tokenizer's SpecialRewriter."""

    def __init__(self, rw, whitespace: str):
        self.rw = rw
        self.json_opts = json_options(whitespace)
        self.rules: list[str] = []
        self.n = 0

    def grammar(self, fmt: dict) -> str:
        top = self.expr(fmt)
        return "\n".join([f"start: {top}"] + self.rules) + "\n"

    def _name(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}_{self.n}"

    # -- leaves
    def lit(self, text: str) -> str:
        if not text:
            return '""'
        return self.rw.literal(text) or json.dumps(text, ensure_ascii=False)

    def rx(self, pattern: str) -> str:
        from llguidance import regex_to_lark

        return self.rw.regex(pattern, "dw") or "/" + regex_to_lark(pattern, "dw") + "/"

    def json(self, schema) -> str:
        name = self._name("json")
        schema = closed(schema) if isinstance(schema, dict) else schema
        if schema is True or schema == {}:
            schema = {}
        if isinstance(schema, dict):
            schema = dict(schema, **{"x-guidance": {**schema.get("x-guidance", {}),
                                                    **self.json_opts}})
        self.rules.append(f"{name}: %json {json.dumps(schema, ensure_ascii=False)}")
        return name

    def terminal(self, regex: str, excluded: Sequence[str] = ()) -> str:
        """A named text terminal: ``regex`` minus any text containing ``excluded``."""
        name = self._name("TEXT")
        body = f"/{regex}/"
        if excluded:
            alts = "|".join(re.escape(e) for e in excluded)
            body += f" & ~/{TEXT_ALL}({alts}){TEXT_ALL}/"
        self.rules.append(f"{name.upper()}: {body}")
        return name.upper()

    # -- composites
    def expr(self, f: dict) -> str:
        t = f["type"]
        if t == "const_string":
            return self.lit(f["value"])
        if t == "regex":
            return self.rx(f["pattern"])
        if t == "json_schema":
            return self.json(f["json_schema"])
        if t == "sequence":
            return "(" + " ".join(self.expr(x) for x in f["elements"]) + ")"
        if t == "or":
            return "(" + " | ".join(self.expr(x) for x in f["elements"]) + ")"
        if t in ("optional", "star", "plus"):
            return "(" + self.expr(f["content"]) + ")" + {"optional": "?", "star": "*",
                                                           "plus": "+"}[t]
        if t == "any_text":
            return self.terminal(self._text_regex(f))
        if t == "tag":
            return self.tag(f)
        if t == "triggered_tags":
            return self.triggered(f)
        raise ValueError(f"unsupported structural format {t!r}")

    @staticmethod
    def _text_regex(f: dict) -> str:
        n = f.get("max_chars")
        return TEXT_ALL if n is None else r"(?s:.{0,%d})" % int(n)

    def tag(self, f: dict) -> str:
        begin, end = f["begin"], f["end"]
        body = self.ended(f["content"], end)
        return f"({self.lit(begin)} {body})" if begin else f"({body})"

    def ended(self, content: dict, end: str) -> str:
        """``content`` then ``end``; free text at the end of ``content`` stops at ``end``."""
        if content.get("type") == "any_text":
            return self.until(end, self.terminal(self._text_regex(content)))
        if content.get("type") == "sequence" and content["elements"]:
            *head, last = content["elements"]
            return " ".join([self.expr(x) for x in head] + [self.ended(last, end)])
        return self.expr(content) + (" " + self.lit(end) if end else "")

    def until(self, end: str, text: str) -> str:
        """``text`` then ``end``, the text ending at the first occurrence of ``end``."""
        if not end:
            return text
        pieces = self.rw.split(end) or [(end, None)]
        first, tok = pieces[0]
        if first is None:  # a special token: the text lexeme cannot run past it
            return f"{text} " + self.lit(end)
        name = self._name("upto")
        self.rules.append(f"{name}[lazy]: {text} {json.dumps(first, ensure_ascii=False)}")
        rest = end[len(first):]
        return name + (" " + self.lit(rest) if rest else "")

    def triggered(self, f: dict) -> str:
        triggers = f["triggers"]
        plain = [t for t in triggers if self.rw.split(t) is None]
        free = self.terminal(TEXT_ALL, plain)
        alts = []
        for t in f["tags"]:
            trig = next(x for x in sorted(triggers, key=len, reverse=True)
                        if t["begin"].startswith(x))
            head = self.until(trig, free)
            rest = dict(t, begin=t["begin"][len(trig):])
            alts.append(f"({head} {self.tag(rest)})")
        tags = "(" + " | ".join(alts) + ")"
        if f.get("stop_after_first"):
            return tags if f.get("at_least_one") else f"({free} | {tags})"
        return f"({tags}{'+' if f.get('at_least_one') else '*'} {free})"
