"""The web chat's side of the memory vault: the ``memory_search`` tool the agent consults,
and the saved sessions as the conversations synthesis reads.

The tool is read-only (it searches the vault's index and quotes lines), so it needs no
approval, like the app tools it sits beside (:mod:`.apptools` dispatches to it).
"""

from __future__ import annotations

from typing import Any

from ..memory.synthesis import Conversation
from ..memory.vault import Vault
from .store import Session, SessionStore, read_entries
from .store import message_text as text_of

MAX_HITS = 8
MAX_QUERY_CHARS = 500
TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "memory_search",
    "description": "Search the user's memory vault (articles written from past chats) for "
                   "what was said before. Returns matching articles and lines.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "words to look for"}},
        "required": ["query"]}}}]
TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOLS)


def run_tool(name: str, args: dict, vault: Vault | None = None) -> dict:
    """The tool's result for the model; ValueError for a call it got wrong."""
    if name != "memory_search":
        raise ValueError(f"unknown tool {name!r}")
    query = args.get("query")
    if not isinstance(query, str) or not query.strip():
        raise ValueError("memory_search needs a non-empty query")
    vault = vault or Vault()
    if not vault.exists:
        return {"articles": [], "hits": [], "note": "no memory vault yet (mlxbun memory init)"}
    found = vault.search(query[:MAX_QUERY_CHARS], "all", MAX_HITS)
    return {"articles": [s["article"] for s in found["summaries"]], "hits": found["hits"]}


def saved_conversations(store: SessionStore) -> list[Conversation]:
    """Each saved session's active branch as user and assistant turns, newest first."""
    out = []
    for path in store.files():
        entries = read_entries(path)
        session = Session(None, path, entries)
        turns = [(e["message"]["role"], text_of(e["message"])) for e in session.branch()
                 if e["message"].get("role") in ("user", "assistant")]
        turns = [(role, text) for role, text in turns if text.strip()]
        if turns:
            out.append(Conversation(str(session.header.get("id") or path.stem),
                                    session.title, turns))
    return out
