"""The memory vault: a folder of markdown articles, their revisions and a search index.

    <root>/README.md                what the folder is (written once)
    <root>/Meta/*.md                notes on how articles are written (written once)
    <root>/Reference/*.md           read-only reference documents (searchable, not linked)
    <root>/articles/<Stem>.md       the articles
    <root>/.vault/history.sqlite    every revision (:mod:`.history`)
    <root>/.vault/index.sqlite      the FTS5 index (:mod:`.index`), rebuilt when missing

The root is ``$MLXBUN_WIKI`` or ``<mlxbun home>/memory``. Articles are plain files, so
any editor works on them; a change made outside is picked up by :meth:`Vault.reindex`.
Writes go through :meth:`Vault.write` (one at a time), which records the revision and
reindexes the article; the articles folder has a byte cap.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import APIError, BadRequest, NotFound
from ..models.paths import mlxbun_home
from . import articles
from .history import History
from .index import SearchIndex

DEFAULT_MAX_BYTES = 256 << 20  # the articles folder
MAX_ARTICLE_BYTES = 1 << 20
README = """# Memory

This folder is mlxbun's memory vault: articles that synthesis writes from saved chats
(`mlxbun memory synthesize`), one markdown file per topic under `articles/`, linked with
`[[Article_Name]]`. Edit them with any editor; run `mlxbun memory init` to reindex.
"""
META = {"Meta/Style.md": "# Style\n\nAn article starts with `# Title` and a one-paragraph "
        "lead, then `## Facts` (one bullet per fact, with its source chat) and "
        "`## See also` (wikilinks).\n",
        "Reference/mlxbun_memory.md": "# The memory vault\n\nSynthesis reads saved chat "
        "sessions, asks the served model for topics and facts as JSON, and writes or patches "
        "one article per topic. Search it with the `memory_search` chat tool or "
        "`GET /api/memory/search`.\n"}
_write_lock = threading.Lock()


class VaultFull(APIError):
    status = 507
    type = "insufficient_storage"


def default_root() -> Path:
    """``$MLXBUN_WIKI`` (``~`` expanded) or ``<mlxbun home>/memory``."""
    env = os.environ.get("MLXBUN_WIKI")
    return Path(env).expanduser() if env else mlxbun_home() / "memory"


@dataclass
class SetupResult:
    root: str
    created: list[str] = field(default_factory=list)
    alreadySetUp: bool = True  # the wire's camelCase names
    gitInitialized: bool = False  # no git here: history lives in SQLite


class Vault:
    """One vault folder."""

    def __init__(self, root: Path | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root) if root is not None else default_root()
        self.max_bytes = max_bytes
        self.articles_dir = self.root / "articles"
        self.history = History(self.root / ".vault" / "history.sqlite")
        self.index = SearchIndex(self.root / ".vault" / "index.sqlite")

    # -- setting up ----------------------------------------------------------------
    @property
    def exists(self) -> bool:
        return self.articles_dir.is_dir()

    def setup(self) -> SetupResult:
        """Create what is missing (idempotent); never overwrites a file."""
        result = SetupResult(root=str(self.root))
        for rel, text in {"README.md": README, **META}.items():
            path = self.root / rel
            if not path.exists():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                result.created.append(rel)
        if not self.articles_dir.is_dir():
            self.articles_dir.mkdir(parents=True)
            result.created.append("articles/")
        result.alreadySetUp = not result.created
        self.reindex()
        return result

    def require(self) -> None:
        if not self.exists:
            raise NoVault(str(self.root))

    # -- reading -------------------------------------------------------------------
    def article_path(self, name: str) -> Path:
        if not isinstance(name, str) or not articles.valid_stem(name):
            raise BadRequest("name must be an article name (letters, digits, _-.,'())")
        return self.articles_dir / f"{name}.md"

    def article_names(self) -> list[str]:
        if not self.exists:
            return []
        return sorted(p.stem for p in self.articles_dir.glob("*.md")
                      if p.is_file() and not p.is_symlink() and articles.valid_stem(p.stem))

    def reference_ids(self) -> list[str]:
        ref = self.root / "Reference"
        return sorted(f"Reference/{p.stem}" for p in ref.glob("*.md") if p.is_file()) \
            if ref.is_dir() else []

    def read(self, name: str) -> str:
        path = self.article_path(name)
        if not path.is_file() or path.is_symlink():
            raise NotFound(f"no article {name!r}")
        return path.read_text(errors="replace")

    def status(self) -> dict:
        names = self.article_names()
        recent = sorted(((n, (self.articles_dir / f"{n}.md").stat().st_mtime) for n in names),
                        key=lambda x: -x[1])[:10]
        return {"root": str(self.root), "exists": self.exists, "articleCount": len(names),
                "referenceCount": len(self.reference_ids()), "isGitRepo": False,
                "history": "sqlite", "indexIncomplete": self.exists and self.index.incomplete(),
                "recentArticles": [{"article": n, "mtimeMs": int(t * 1000)} for n, t in recent],
                **self._coverage()}

    def _coverage(self) -> dict:
        """Sessions synthesis has read, its last run and the index's size on disk."""
        covered, last = self.history.sources_read()
        index_bytes = sum(p.stat().st_size for p in self.index.path.parent.glob(
            self.index.path.name + "*") if p.is_file())
        return {"sessionsCovered": covered,
                "lastSynthesisMs": int(last * 1000) if last is not None else None,
                "indexBytes": index_bytes}

    def article(self, name: str) -> dict:
        """The article's source and what a panel shows beside it."""
        text = self.read(name)
        return {"name": name, "path": str(self.article_path(name)), "content": text,
                "infobox": {"type": "article", "entityKind": "thing", "fields": []},
                "lead": articles.lead(text), "series": None,
                "structure": [vars(s) for s in articles.structure(text)]}

    def links(self, name: str) -> dict:
        outbound = articles.outbound_links(self.read(name))
        inbound = [other for other in self.article_names() if other != name
                   and name in articles.outbound_links(self.read(other))]
        return {"name": name, "outbound": outbound, "inbound": inbound}

    def log(self, name: str, limit: int) -> list[dict]:
        self.read(name)  # a 404 for an unknown article
        return self.history.log(name, limit)

    def diff(self, name: str, rev: str) -> str:
        self.read(name)
        text = self.history.diff(name, rev, f"articles/{name}.md")
        if text is None:
            raise NotFound(f"revision {rev} has no change to {name!r}")
        return text

    def search(self, query: str, scope: str = "all", limit: int = 50) -> dict:
        return self.index.search(query, scope, limit)

    # -- writing -------------------------------------------------------------------
    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.articles_dir.glob("*.md") if p.is_file())

    def write(self, name: str, text: str, subject: str) -> str | None:
        """Write article ``name``, record the revision, reindex it; the revision id (None:
        the text did not change)."""
        path = self.article_path(name)
        data = text.encode()
        if len(data) > MAX_ARTICLE_BYTES:
            raise VaultFull(f"article {name!r} would pass {MAX_ARTICLE_BYTES >> 20} MiB")
        with _write_lock:
            self.require()
            old = path.stat().st_size if path.is_file() else 0
            if self.used_bytes() - old + len(data) > self.max_bytes:
                raise VaultFull(f"the vault's articles passed their {self.max_bytes >> 20} MiB "
                                "cap: delete some")
            tmp = path.with_suffix(".md.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            rev = self.history.record(name, text, subject)
            self.index.put(name, "articles", text)
        return rev

    def reindex(self) -> None:
        """Rebuild the index from the files (edits made outside mlxbun included)."""
        docs = [(name, "articles", self.read(name)) for name in self.article_names()]
        docs += [(ref, "reference", (self.root / f"{ref}.md").read_text(errors="replace"))
                 for ref in self.reference_ids()]
        self.index.put_many(docs, clear=True)


NO_VAULT = "no memory vault yet"


class NoVault(APIError):
    """No vault has been set up at the root yet."""

    status = 404
    type = "not_found_error"

    def __init__(self, root: str):
        super().__init__(NO_VAULT)
        self.root = root
