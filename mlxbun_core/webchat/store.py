"""Chat sessions as append-only JSONL files, one per session, in one directory.

A file starts with a ``{"type": "session"}`` header; every later line is an entry:

- ``message``: ``{id, parentId, ts, message: {role, content, ...}, meta?}``. Messages form a
  tree (a regenerated answer or an edited question is a sibling: same ``parentId``). A
  later ``message`` line with an id already seen replaces that message in place (an
  answer saved as it streams, then finished);
- ``append``: ``{id, content?, reasoning?}``, text to add to a message being answered
  (an answer is saved as it streams: a first ``message`` line marked
  ``meta.finish = "interrupted"``, then ``append`` lines, then its final ``message`` line;
  a crash leaves the marked partial answer);
- ``leaf``: ``{id}``, the branch the user switched to (otherwise the newest message);
- ``settings``: a partial update of the session's system prompt, thinking switch, sampling
  and adapter (later lines win).

Nothing is ever rewritten, so a crash can only tear the last line; readers skip any
line that does not parse. The directory and each file have a byte cap.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ..errors import APIError, BadRequest, NotFound

DEFAULT_MAX_BYTES = 1 << 30  # the whole directory
DEFAULT_MAX_FILE_BYTES = 64 << 20  # one session
SUFFIX = ".jsonl"
TITLE_CHARS = 60


class StoreFull(APIError):
    status = 507
    type = "insufficient_storage"


def sessions_dir(home: Path | None = None) -> Path:
    """Where sessions live: ``<mlxbun home>/sessions`` unless ``home`` says otherwise."""
    from ..models.paths import mlxbun_home

    return Path(home) if home is not None else mlxbun_home() / "sessions"


def read_entries(path: Path) -> list:
    """Every entry that parses, in file order; a torn or corrupt line is skipped."""
    out = []
    with open(path, "rb") as f:
        for raw in f:
            try:
                entry = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(entry, dict) and isinstance(entry.get("type"), str):
                out.append(entry)
    return out


def message_text(message: dict) -> str:
    """The plain text of a message's content (text parts joined; media skipped)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and p.get("type") == "text")
    return ""


class Session:
    """One session file, replayed into a message tree."""

    def __init__(self, store: SessionStore | None, path: Path, entries: list):
        """``store`` None: a read-only replay (:func:`replayed_messages`)."""
        self.store, self.path = store, path
        self.header: dict = {}
        self.messages: dict = {}  # id -> message entry
        self.children: dict = {}  # parentId (None for roots) -> [ids], oldest first
        self.settings: dict = {}
        self.leaf: str | None = None
        for entry in entries:
            self._apply(entry)

    def _apply(self, entry: dict) -> None:
        kind = entry["type"]
        if kind == "session":
            self.header = entry
        elif kind == "message" and isinstance(entry.get("message"), dict) and entry.get("id"):
            if entry["id"] in self.messages:  # the finished version of a partial answer
                self.messages[entry["id"]] = {**entry, "parentId":
                                              self.messages[entry["id"]].get("parentId")}
                return
            self.messages[entry["id"]] = entry
            self.children.setdefault(entry.get("parentId"), []).append(entry["id"])
            self.leaf = entry["id"]
        elif kind == "append" and entry.get("id") in self.messages:
            self._extend(self.messages[entry["id"]], entry)
        elif kind == "leaf" and entry.get("id") in self.messages:
            self.leaf = entry["id"]
        elif kind == "settings" and isinstance(entry.get("values"), dict):
            self.settings.update(entry["values"])

    def _extend(self, target: dict, entry: dict) -> None:
        message = target["message"] = dict(target["message"])
        for key, field in (("content", "content"), ("reasoning", "reasoning_content")):
            more = entry.get(key)
            if isinstance(more, str) and more:
                have = message.get(field)
                message[field] = (have if isinstance(have, str) else "") + more

    # -- reading ------------------------------------------------------------------
    def branch(self, leaf: str | None = None) -> list:
        """Message entries from the root to ``leaf`` (default: the active leaf)."""
        out, cur, seen = [], leaf or self.leaf, set()
        while cur is not None and cur in self.messages and cur not in seen:
            seen.add(cur)
            out.append(self.messages[cur])
            cur = self.messages[cur].get("parentId")
        return out[::-1]

    def siblings(self, entry_id: str) -> list:
        entry = self.messages[entry_id]
        return list(self.children.get(entry.get("parentId"), []))

    def newest_leaf_under(self, entry_id: str) -> str:
        """Follow the newest child down from ``entry_id``."""
        cur = entry_id
        while self.children.get(cur):
            cur = self.children[cur][-1]
        return cur

    @property
    def title(self) -> str:
        return session_title(self.header, self.messages.values())

    # -- writing ------------------------------------------------------------------
    def new_id(self) -> str:
        while True:
            eid = "m" + secrets.token_hex(5)
            if eid not in self.messages:
                return eid

    def add_message(self, message: dict, parent_id: str | None, meta: dict | None = None) -> dict:
        entry = {"type": "message", "id": self.new_id(), "parentId": parent_id,
                 "ts": round(time.time(), 3), "message": message}
        if meta:
            entry["meta"] = meta
        self.write(entry)
        return entry

    def append_text(self, entry_id: str, content: str = "", reasoning: str = "") -> None:
        """Add streamed text to the message ``entry_id`` (an answer being saved as it goes)."""
        entry = {"type": "append", "id": entry_id}
        if content:
            entry["content"] = content
        if reasoning:
            entry["reasoning"] = reasoning
        if len(entry) > 2:
            self.write(entry)

    def replace_message(self, entry_id: str, message: dict, meta: dict | None = None) -> dict:
        """Write the finished version of message ``entry_id`` (it keeps its place in the tree)."""
        old = self.messages[entry_id]
        entry = {"type": "message", "id": entry_id, "parentId": old.get("parentId"),
                 "ts": round(time.time(), 3), "message": message}
        if meta:
            entry["meta"] = meta
        self.write(entry)
        return self.messages[entry_id]

    def set_leaf(self, entry_id: str) -> None:
        if entry_id not in self.messages:
            raise NotFound(f"no message {entry_id!r} in this session")
        self.write({"type": "leaf", "id": entry_id})

    def update_settings(self, values: dict) -> None:
        if values:
            self.write({"type": "settings", "values": values})

    def write(self, entry: dict) -> None:
        """Append ``entry`` to the session's file and apply it (a fork copies its
        source's branch this way)."""
        if self.store is None:
            raise RuntimeError("a replayed session is read-only")
        self.store.append(self.path, entry)
        self._apply(entry)


def session_title(header: dict, messages) -> str:
    if header.get("title"):
        return header["title"]
    for entry in messages:
        if entry["message"].get("role") == "user":
            text = " ".join(message_text(entry["message"]).split())
            if text:
                return text if len(text) <= TITLE_CHARS else text[:TITLE_CHARS - 1] + "…"
    return "New chat"


class SessionStore:
    """The sessions directory: create, open, list, fork, delete; paths stay inside it."""

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES,
                 max_file_bytes: int = DEFAULT_MAX_FILE_BYTES):
        self.root = Path(root)
        self.max_bytes, self.max_file_bytes = max_bytes, max_file_bytes
        self.turns: dict = {}  # session file -> the task of the turn answering in it now

    def files(self) -> list:
        """Session files, newest first (by modification time)."""
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.suffix == SUFFIX and p.is_file()
                 and not p.is_symlink()]
        return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)

    def used_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files())

    def resolve(self, path) -> Path:
        """``path`` (absolute, or a file name in the directory) as a session file inside it.

        Anything that resolves outside the directory (``..``, a symlink out) or is not a
        ``.jsonl`` file is a 400; a file that does not exist is a 404.
        """
        if not isinstance(path, str) or not path or "\0" in path:
            raise BadRequest("path is required")
        root = self.root.resolve()
        target = (root / path).resolve()
        if target.parent != root or target.suffix != SUFFIX:
            raise BadRequest("path must name a session file inside the sessions directory")
        if not target.is_file():
            raise NotFound("no such session")
        return target

    def create(self, header: dict | None = None) -> Session:
        self.root.mkdir(parents=True, exist_ok=True)
        while True:
            name = time.strftime("%Y%m%d_%H%M%S") + "_" + secrets.token_hex(3) + SUFFIX
            path = self.root / name
            if not path.exists():
                break
        head = {"type": "session", "version": 1, "id": uuid.uuid4().hex,
                "created": round(time.time(), 3), **(header or {})}
        self.append(path, head)
        return Session(self, path, [head])

    def open(self, path) -> Session:
        target = self.resolve(path)
        return Session(self, target, read_entries(target))

    def fork(self, path, leaf: str | None = None) -> Session:
        """A new session holding the source's active branch (or the branch to ``leaf``)."""
        source = self.open(path)
        branch = source.branch(leaf)
        fork = self.create({"forkedFrom": str(source.path)})
        fork.update_settings(dict(source.settings))
        for entry in branch:
            fork.write(dict(entry))
        return fork

    def delete(self, path) -> Path:
        target = self.resolve(path)
        target.unlink()
        return target

    def summaries(self, limit: int = 200) -> list:
        out = []
        for path in self.files()[:limit]:
            entries = read_entries(path)
            head: dict = next((e for e in entries if e["type"] == "session"), {})
            msgs = replayed_messages(entries)
            out.append({"path": str(path), "title": session_title(head, msgs),
                        "created": head.get("created"), "updated": path.stat().st_mtime,
                        "messages": len(msgs)})
        return out

    def append(self, path: Path, entry: dict) -> None:
        """Write one line; start on a fresh line if a crash left the last one torn."""
        line = (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        size = path.stat().st_size if path.exists() else 0
        if size + len(line) > self.max_file_bytes:
            raise StoreFull(f"this session is full ({self.max_file_bytes >> 20} MiB cap): "
                            "start a new one")
        if self.used_bytes() + len(line) > self.max_bytes:
            raise StoreFull(f"the sessions directory is full ({self.max_bytes >> 20} MiB cap): "
                            "delete old sessions")
        with open(path, "ab+") as f:
            if size:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = b"\n" + line
            f.write(line)


def replayed_messages(entries: list) -> list:
    """The message entries ``entries`` replay into (partial answers finished or extended),
    in the order they were first written."""
    return list(Session(None, Path(), entries).messages.values())


def compacted(entries: list) -> list:
    """``entries`` with each message once, in its final form, where it was first written
    (``append`` lines folded in): what an export shows."""
    final = {e["id"]: e for e in replayed_messages(entries)}
    out, seen = [], set()
    for entry in entries:
        if entry["type"] == "append":
            continue
        if entry["type"] == "message":
            if entry.get("id") in seen or entry.get("id") not in final:
                continue
            seen.add(entry["id"])
            entry = final[entry["id"]]
        out.append(entry)
    return out


def iter_message_entries(path: Path) -> Iterator[dict]:
    yield from replayed_messages(read_entries(path))
