"""``mlxbun memory link``: the deterministic cross-linking pass (no model).

In each article, the first plain mention of another article's title becomes a wikilink
(``[[Kiwi_fruit|kiwi fruit]]``), and ``## See also`` is rebuilt as the list of every
existing article the text links to (its earlier entries kept while their articles exist).
Headings, fenced code, existing links and the See also section itself are never
rewritten. Running it twice changes nothing the second time.
"""

from __future__ import annotations

import re

from . import articles

_LINK_SPAN = re.compile(r"\[\[[^\[\]\n]*\]\]")


def _mention(title: str) -> re.Pattern[str]:
    words = [re.escape(w) for w in title.split()]
    return re.compile(r"(?<![\w\[|])" + r"[\s_]+".join(words) + r"(?![\w\]])", re.IGNORECASE)


def _link_first(lines: list[str], stem: str) -> bool:
    """Link the first plain mention of ``stem``'s title in ``lines`` (in place)."""
    pattern, fenced = _mention(stem.replace("_", " ")), False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced or articles.HEADING_RE.match(line):
            continue
        taken = [m.span() for m in _LINK_SPAN.finditer(line)]
        for m in pattern.finditer(line):
            if any(a <= m.start() < b for a, b in taken):
                continue
            text = m.group(0)
            link = f"[[{stem}]]" if text == stem else f"[[{stem}|{text}]]"  # reads as written
            lines[i] = line[:m.start()] + link + line[m.end():]
            return True
    return False


def link_article(text: str, name: str, names: list[str]) -> tuple[str, int]:
    """``text`` with first mentions of the other ``names`` linked and See also rebuilt;
    and how many mentions it linked."""
    lines = text.rstrip("\n").splitlines()
    see = articles.section_bounds(lines, articles.SEE_ALSO)
    body, tail = (lines[:see[0] - 1], []) if see else (lines, [])
    if see:
        tail = lines[see[1]:]  # sections after See also stay where they are
    linked = set(articles.outbound_links("\n".join(body + tail)))
    added = 0
    for other in sorted(names, key=len, reverse=True):  # "Kiwi fruit" before "Kiwi"
        if other != name and other not in linked and _link_first(body, other):
            linked.add(other)
            added += 1
    kept = articles.outbound_links("\n".join(lines[see[0]:see[1]])) if see else []
    targets = [s for s in dict.fromkeys(articles.outbound_links("\n".join(body + tail)) + kept)
               if s in names and s != name]
    while body and not body[-1].strip():
        body.pop()
    out = body + ([""] + tail if tail else [])
    if targets:
        out += ["", f"## {articles.SEE_ALSO}", ""] + [f"- [[{s}]]" for s in targets]
    return "\n".join(out) + "\n", added
