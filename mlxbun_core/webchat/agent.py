"""What one /ws/chat connection is: an open session, its settings, at most one running turn.

The transport hands client frames (dicts) to :meth:`ChatAgent.handle` and gives the
agent a ``send`` coroutine for server frames. Client mistakes become ``error`` frames;
the connection stays usable.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import re
from typing import Awaitable, Callable, Optional

from ..engine.sampling import SamplingParams, max_tokens_from
from ..errors import APIError, BadRequest
from . import apptools
from .store import Session, SessionStore, message_text
from .turn import Turn

log = logging.getLogger("mlxbun.webchat")

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "xtc_probability", "xtc_threshold",
                 "repetition_penalty", "repetition_context_size", "presence_penalty",
                 "frequency_penalty", "seed", "max_tokens", "logit_bias")
MAX_IMAGES = 8
MAX_IMAGE_CHARS = 12 << 20  # base64 characters across one prompt's images
MAX_TEXT_CHARS = 1 << 20
SETTLE_S = 3.0  # how long opening a session waits for a turn still answering in it
IMAGE_MIME = re.compile(r"image/[A-Za-z0-9.+-]+")
Send = Callable[[dict], Awaitable[None]]


def _text_arg(frame: dict, key: str = "text") -> str:
    text = frame.get(key)
    if not isinstance(text, str):
        raise BadRequest(f"{key} must be a string")
    if len(text) > MAX_TEXT_CHARS:
        raise BadRequest(f"{key} is longer than {MAX_TEXT_CHARS} characters")
    return text


def image_parts(images) -> list:
    """``[{data, mimeType}]`` (base64) as OpenAI ``image_url`` data-URL parts."""
    if images is None:
        return []
    if not isinstance(images, list) or len(images) > MAX_IMAGES:
        raise BadRequest(f"images must be a list of at most {MAX_IMAGES} {{data, mimeType}} objects")
    parts, total = [], 0
    for img in images:
        data = img.get("data") if isinstance(img, dict) else None
        mime = img.get("mimeType") if isinstance(img, dict) else None
        if not isinstance(data, str) or not isinstance(mime, str) or not IMAGE_MIME.fullmatch(mime):
            raise BadRequest("each image needs base64 'data' and an image/* 'mimeType'")
        total += len(data)
        if total > MAX_IMAGE_CHARS:
            raise BadRequest(f"images are larger than {MAX_IMAGE_CHARS >> 20} MiB of base64")
        try:
            base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest("image data is not valid base64")
        parts.append({"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}})
    return parts


def history_item(session: Session, entry: dict) -> dict:
    """A message entry as the page renders it."""
    msg = entry["message"]
    item = {"id": entry["id"], "parentId": entry.get("parentId"), "role": msg.get("role"),
            "content": message_text(msg)}
    if isinstance(msg.get("content"), list):
        urls = [p["image_url"]["url"] for p in msg["content"]
                if isinstance(p, dict) and p.get("type") == "image_url"]
        if urls:
            item["images"] = urls
    if msg.get("reasoning_content"):
        item["reasoning"] = msg["reasoning_content"]
    if msg.get("tool_calls"):
        item["toolCalls"] = [{"id": c.get("id"), "name": c["function"]["name"],
                              "arguments": c["function"].get("arguments")} for c in msg["tool_calls"]]
    if msg.get("role") == "tool":
        item["toolCallId"], item["name"] = msg.get("tool_call_id"), msg.get("name")
    if entry.get("meta"):
        item["meta"] = entry["meta"]
    sibs = session.siblings(entry["id"])
    if len(sibs) > 1:
        item["siblings"] = {"index": sibs.index(entry["id"]), "count": len(sibs), "ids": sibs}
    return item


class ChatAgent:
    """The web chat's agent for one connection."""

    def __init__(self, engine, store: SessionStore, send: Send, ready: dict):
        self.engine, self.store, self.send, self.ready = engine, store, send, ready
        self.session: Optional[Session] = None
        self.draft_settings: dict = {}  # settings of a session not written yet
        self.next_turn: dict = {}  # sampling for the next turn only
        self.app_context: Optional[dict] = None
        self.turn: Optional[Turn] = None
        self.task: Optional[asyncio.Task] = None

    # -- lifecycle --------------------------------------------------------------------
    async def hello(self) -> None:
        await self.send({"type": "ready", **self.ready})
        await self.send_state()

    async def close(self) -> None:
        """The client left: stop the turn (its partial answer is saved) and wait for it."""
        if self.turn is not None:
            self.turn.abort()
        if self.task is not None:
            await asyncio.gather(self.task, return_exceptions=True)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    async def handle(self, frame) -> None:
        """Dispatch one client frame; client mistakes are answered with an error frame."""
        kind = frame.get("type") if isinstance(frame, dict) else None
        handler = getattr(self, f"on_{kind}", None) if isinstance(kind, str) else None
        try:
            if handler is None:
                raise BadRequest(f"unknown frame type {kind!r}")
            await handler(frame)
        except APIError as exc:
            await self.send({"type": "error", "message": exc.message, "status": exc.status})
        except Exception:  # a bug or a disk error must not end the connection
            log.exception("web chat frame %r failed", kind)
            await self.send({"type": "error", "message": f"{kind} failed; see the server log",
                             "status": 500})

    # -- settings -----------------------------------------------------------------------
    @property
    def settings(self) -> dict:
        return self.session.settings if self.session else self.draft_settings

    def _update(self, values: dict) -> None:
        if self.session is not None:
            self.session.update_settings(values)
        else:
            self.draft_settings.update(values)

    async def on_set_thinking(self, frame) -> None:
        enabled = frame.get("enabled")
        if enabled is not None and not isinstance(enabled, bool):
            raise BadRequest("enabled must be true, false or null")
        self._update({"thinking": enabled})
        await self.send_settings()

    async def on_set_system_prompt(self, frame) -> None:
        text = frame.get("text")
        if text is not None:
            text = _text_arg(frame)
        self._update({"systemPrompt": text or None})
        await self.send_settings()

    async def on_set_adapter(self, frame) -> None:
        adapter = frame.get("id")
        if adapter is not None and not isinstance(adapter, str):
            raise BadRequest("id must be an adapter id or null")
        self._update({"adapter": adapter or None})
        await self.send_settings()

    async def on_set_sampling(self, frame) -> None:
        scope = frame.get("scope") or "session"
        if scope not in ("session", "next_turn"):
            raise BadRequest("scope must be 'session' or 'next_turn'")
        changes = {k: frame[k] for k in SAMPLING_KEYS if k in frame}
        current = dict(self.next_turn if scope == "next_turn" else self.settings.get("sampling") or {})
        current.update(changes)
        current = {k: v for k, v in current.items() if v is not None}  # null: server default
        SamplingParams.from_body(current)  # a bad value is a 400 now, not at the next turn
        max_tokens_from(current, None)
        if scope == "next_turn":
            self.next_turn = current
        else:
            self._update({"sampling": current})
        await self.send_settings()

    async def on_context(self, frame) -> None:
        self.app_context = apptools.clean_context(frame.get("context"))

    # -- sessions ---------------------------------------------------------------------
    async def on_list_sessions(self, frame) -> None:
        await self.send_sessions()

    async def on_new_session(self, frame) -> None:
        self._idle_required()
        self.draft_settings = dict(self.settings)  # a new chat keeps the current settings
        self.session = None
        await self.send_state()

    async def on_open_session(self, frame) -> None:
        self._idle_required()
        target = self.store.resolve(frame.get("path"))
        await self._settle(target)
        self.session = self.store.open(str(target))
        await self.send_state()

    async def _settle(self, path) -> None:
        """Wait (briefly) for a turn still answering in ``path``: a reloaded page's old
        connection is stopping it, and its last save is what the new page should show."""
        task = self.store.turns.get(path)
        if task is not None and task is not self.task and not task.done():
            await asyncio.wait({task}, timeout=SETTLE_S)

    async def on_fork_session(self, frame) -> None:
        self._idle_required()
        self.session = self.store.fork(frame.get("path") or self._active_path(), frame.get("entryId"))
        await self.send_state()

    async def on_delete_session(self, frame) -> None:
        target = self.store.resolve(frame.get("path"))
        if self.session is not None and self.session.path.resolve() == target:
            self._idle_required()
            self.draft_settings, self.session = dict(self.session.settings), None
            self.store.delete(str(target))
            await self.send_state()
        else:
            self.store.delete(str(target))
            await self.send_sessions()

    async def on_switch_sibling(self, frame) -> None:
        self._idle_required()
        entry_id = frame.get("entryId")
        if self.session is None or entry_id not in self.session.messages:
            raise BadRequest("entryId must name a message of the open session")
        self.session.set_leaf(self.session.newest_leaf_under(entry_id))
        await self.send_history()

    def _active_path(self) -> str:
        if self.session is None:
            raise BadRequest("no session is open")
        return str(self.session.path)

    def _idle_required(self) -> None:
        if self.running:
            raise BadRequest("a turn is running: abort it first")

    # -- turns ------------------------------------------------------------------------
    async def on_prompt(self, frame) -> None:
        self._idle_required()
        text = _text_arg(frame)
        images = image_parts(frame.get("images"))
        if not text.strip() and not images:
            raise BadRequest("the message is empty")
        content = [{"type": "text", "text": text}, *images] if images else text
        parent = self.session.leaf if self.session else None
        await self._begin({"role": "user", "content": content}, parent)

    async def on_edit_resend(self, frame) -> None:
        self._idle_required()
        text = _text_arg(frame)
        target = self._user_entry(frame.get("entryId"))
        content = target["message"].get("content")
        if isinstance(content, list):  # keep the attachments, replace the words
            content = [{"type": "text", "text": text},
                       *[p for p in content if isinstance(p, dict) and p.get("type") != "text"]]
        else:
            content = text
        await self._begin({"role": "user", "content": content}, target.get("parentId"))

    async def on_regenerate(self, frame) -> None:
        self._idle_required()
        target = self._user_entry(frame.get("entryId"))
        await self._begin(None, target["id"])

    async def on_abort(self, frame) -> None:
        if self.turn is not None:
            self.turn.abort()

    def _user_entry(self, entry_id) -> dict:
        branch = self.session.branch() if self.session else []
        users = [e for e in branch if e["message"].get("role") == "user"]
        if entry_id is not None:
            users = [e for e in users if e["id"] == entry_id]
        if not users:
            raise BadRequest("there is no user message to answer again")
        return users[-1]

    async def _begin(self, user_message: Optional[dict], parent_id: Optional[str]) -> None:
        """Start the engine first (a refusal saves nothing), then save and stream."""
        history = self.session.branch(parent_id) if (self.session and parent_id) else []
        messages = self.model_messages(history)
        if user_message is not None:
            messages.append(user_message)
        turn = Turn(self, self.request_body(messages))
        self.next_turn = {}
        if not await turn.start():
            return
        try:
            if user_message is not None:
                parent_id = (await self.save(user_message, parent_id))["id"]
        except APIError:
            turn.abort()
            raise
        self.turn = turn
        key = self.session.path.resolve()
        self.task = self.store.turns[key] = asyncio.create_task(self._run(turn, parent_id, key))

    async def _run(self, turn: Turn, parent_id: str, key) -> None:
        try:
            await turn.run(parent_id)
            await self.send_history()
        except Exception:  # the connection must outlive a bug in one turn
            log.exception("web chat turn failed")
            await self.send({"type": "error", "message": "the turn failed; see the server log"})
        finally:
            self.turn = None
            if self.store.turns.get(key) is asyncio.current_task():
                del self.store.turns[key]

    def request_body(self, messages: list) -> dict:
        s = self.settings
        system = "\n\n".join(x for x in (s.get("systemPrompt"),
                                         apptools.ambient_line(self.app_context)) if x)
        if system:
            messages = [{"role": "system", "content": system}] + messages
        body = {"messages": messages, "tools": apptools.TOOLS, "stream": True,
                **(s.get("sampling") or {}), **self.next_turn}
        if s.get("thinking") is not None:
            body["chat_template_kwargs"] = {"enable_thinking": s["thinking"]}
        if s.get("adapter"):
            body["adapter"] = s["adapter"]
        return body

    @staticmethod
    def model_messages(entries: list) -> list:
        return [dict(e["message"]) for e in entries]

    async def save(self, message: dict, parent_id: Optional[str], meta: Optional[dict] = None) -> dict:
        created = self.session is None
        if created:
            self.session = self.store.create({"model": self.ready.get("model")})
            self.session.update_settings({k: v for k, v in self.draft_settings.items() if v is not None})
        entry = self.session.add_message(message, parent_id, meta)
        if created:
            await self.send_sessions()
        return entry

    # -- server frames ------------------------------------------------------------------
    async def send_state(self) -> None:
        await self.send_settings()
        await self.send_history()
        await self.send_sessions()
        await self.send_context(await self._count_tokens())

    async def send_settings(self) -> None:
        s = self.settings
        await self.send({"type": "settings", "systemPrompt": s.get("systemPrompt"),
                         "thinking": s.get("thinking"), "sampling": s.get("sampling") or {},
                         "nextTurn": self.next_turn, "adapter": s.get("adapter")})

    async def send_history(self) -> None:
        session = self.session
        branch = session.branch() if session else []
        await self.send({"type": "history", "items": [history_item(session, e) for e in branch]})
        answer = next((e for e in reversed(branch) if e["message"].get("role") == "assistant"), None)
        if answer is not None:  # the answer regenerate would replace
            first = self._first_answer(answer["id"])
            sibs = session.siblings(first)
            await self.send({"type": "siblings", "entryId": first, "index": sibs.index(first),
                             "count": len(sibs), "siblingIds": sibs})

    def _first_answer(self, entry_id: str) -> str:
        """The first assistant message after the user message that ``entry_id`` answers."""
        msgs = self.session.messages
        while True:
            parent = msgs[entry_id].get("parentId")
            if parent is None or msgs[parent]["message"].get("role") == "user":
                return entry_id
            entry_id = parent

    async def send_sessions(self) -> None:
        await self.send({"type": "sessions", "items": self.store.summaries(),
                         "activePath": str(self.session.path) if self.session else None})

    async def send_context(self, tokens: int) -> None:
        window = self.engine.model.context_window
        await self.send({"type": "context", "tokens": tokens, "contextWindow": window,
                         "percent": round(100.0 * tokens / window, 1) if window else None})

    async def _count_tokens(self) -> int:
        if self.session is None or not self.session.branch():
            return 0
        try:
            req = self.engine.parse_chat(self.request_body(self.model_messages(self.session.branch())))
            return await self.engine.count_prompt_tokens(req)
        except APIError:  # e.g. images for a model without vision: the count is unknown
            return 0
