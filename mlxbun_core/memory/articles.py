"""An article's text: names, wikilinks, sections, and the edits synthesis makes.

An article is a markdown file ``articles/<Stem>.md``: a ``# Title`` line, a lead
paragraph, then ``## `` sections. ``[[Target]]``, ``[[Target|label]]`` and
``[[Target#anchor]]`` link to other articles by stem (spaces and underscores are the same).
Everything here is pure text, so the vault, the index and the synthesis agree on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_STEM_CHARS = 80
STEM_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-.,'()]{0,79}$")
WIKILINK_RE = re.compile(r"\[\[([^\[\]|#\n]{1,200})(?:#[^\[\]|\n]*)?(?:\|[^\[\]\n]*)?\]\]")
HEADING_RE = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
FACTS = "Facts"
SEE_ALSO = "See also"


def stem_of(title: str) -> str | None:
    """The file stem of an article titled ``title`` (``Kiwi fruit`` → ``Kiwi_fruit``), or
    None when nothing usable is left (a title of punctuation only)."""
    words = re.findall(r"[A-Za-z0-9][A-Za-z0-9\-.,'()]*", title.replace("_", " "))
    stem = "_".join(words).strip("_.,-'()")[:MAX_STEM_CHARS].rstrip("_.,-'(")
    return stem if stem and STEM_RE.match(stem) and ".." not in stem else None


def valid_stem(name: str) -> bool:
    """Whether ``name`` can name an article file: no path separators, no ``..``."""
    return bool(STEM_RE.match(name)) and ".." not in name


def anchor_of(heading: str) -> str:
    """The anchor of a heading: lower case, words joined by ``-``."""
    return "-".join(re.findall(r"[a-z0-9]+", heading.lower()))


def outbound_links(text: str) -> list[str]:
    """The stems ``text`` links to, first mention first, each once."""
    out: dict[str, None] = {}
    for target in WIKILINK_RE.findall(text):
        stem = stem_of(target.strip())
        if stem:
            out.setdefault(stem, None)
    return list(out)


@dataclass
class Section:
    level: int
    title: str
    anchor: str
    line: int  # 1-based line of the heading


def structure(text: str) -> list[Section]:
    """The headings of ``text``, outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = None if fenced else HEADING_RE.match(line)
        if m:
            out.append(Section(len(m.group(1)), m.group(2), anchor_of(m.group(2)), n))
    return out


def lead(text: str) -> str:
    """The first paragraph after the title."""
    para: list[str] = []
    for line in text.splitlines():
        if line.startswith("#"):
            if para:
                break
            continue
        if not line.strip():
            if para:
                break
            continue
        para.append(line.strip())
    return " ".join(para)


def render(title: str, summary: str, facts: list[str], see_also: list[str]) -> str:
    """A new article."""
    parts = [f"# {title}", "", summary.strip() or f"{title}.", "", f"## {FACTS}", ""]
    parts += [f"- {f}" for f in facts] or ["- (none yet)"]
    if see_also:
        parts += ["", f"## {SEE_ALSO}", ""] + [f"- [[{s}]]" for s in see_also]
    return "\n".join(parts) + "\n"


def section_bounds(lines: list[str], title: str) -> tuple[int, int] | None:
    """``(first body line, end)`` of the ``## title`` section, or None."""
    start = next((i for i, line in enumerate(lines) if line.strip() == f"## {title}"), None)
    if start is None:
        return None
    end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")),
               len(lines))
    return start + 1, end


def add_bullets(text: str, section: str, bullets: list[str]) -> str:
    """``text`` with ``bullets`` not already there appended to ``## section`` (made at the
    end if missing). Returns ``text`` unchanged when every bullet is there."""
    lines = text.rstrip("\n").splitlines()
    present = {line.strip() for line in lines}
    new = [f"- {b}" for b in bullets if f"- {b}" not in present]
    if not new:
        return text
    bounds = section_bounds(lines, section)
    if bounds is None:
        lines += ["", f"## {section}", ""] + new
    else:
        _, end = bounds
        while end > bounds[0] and not lines[end - 1].strip():
            end -= 1
        lines[end:end] = new
    return "\n".join(lines) + "\n"


def excerpt(line: str, limit: int = 240) -> str:
    text = " ".join(line.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
