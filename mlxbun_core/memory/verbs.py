"""The small ``mlxbun memory`` verbs over the vault's files: ``toc``, ``section``, ``open``
and ``link`` (the cross-linking pass of :mod:`.linking`)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from ..errors import NotFound
from . import articles
from .linking import link_article
from .vault import Vault


def toc(vault: Vault, name: str) -> str:
    """One line per heading: indented by level, its anchor in parentheses."""
    return "\n".join(f"{'  ' * (s.level - 1)}{s.title}  (#{s.anchor})"
                     for s in articles.structure(vault.read(name)))


def section(vault: Vault, name: str, anchor: str) -> str:
    """The heading with that anchor and its text, up to the next heading of its level or
    above (its subsections included)."""
    text = vault.read(name)
    heads = articles.structure(text)
    wanted = anchor.lstrip("#").lower()
    hit = next((s for s in heads if s.anchor == wanted), None)
    if hit is None:
        known = ", ".join(s.anchor for s in heads) or "none"
        raise NotFound(f"no section {anchor!r} in {name} (anchors: {known})")
    end = next((s.line for s in heads if s.line > hit.line and s.level <= hit.level), None)
    lines = text.splitlines()
    return "\n".join(lines[hit.line - 1:(end - 1) if end else len(lines)]).rstrip()


def cmd_open(vault: Vault, name: str | None) -> int:
    """Print the vault's (or the article's) path and hand it to the system's opener
    (``open`` on macOS, ``xdg-open`` elsewhere) when there is one."""
    path = vault.article_path(name) if name else vault.root
    if name:
        vault.read(name)  # a 404 for an unknown article
    print(path)
    opener = shutil.which("open" if sys.platform == "darwin" else "xdg-open")
    if opener is None:
        print("mlxbun: no opener (xdg-open) here: open the path above yourself",
              file=sys.stderr)
        return 0
    subprocess.Popen([opener, str(path)], stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    return 0


def cmd_link(vault: Vault, limit: int | None) -> int:
    names = vault.article_names()
    changed = links = 0
    for name in names[:limit] if limit is not None else names:
        text = vault.read(name)
        new, added = link_article(text, name, names)
        if new != text:
            vault.write(name, new, "link: first mentions and See also")
            changed += 1
            links += added
            print(f"{name}: {added} mentions linked, See also rebuilt")
    print(f"mlxbun: {changed} of {len(names)} articles changed, {links} links added")
    return 0
