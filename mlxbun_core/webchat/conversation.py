"""One /ws/chat connection's state, and what it tells the page.

The open session (or, before the first message, the settings of a session not written
yet), the sampling for the next turn only, the page's context for app tools and the task
of the running turn. The frame handlers (:mod:`.settings_frames`, :mod:`.session_frames`,
:mod:`.turn_frames`) and the running :class:`~.turn.Turn` all work on this one object;
it knows none of them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import APIError, BadRequest
from . import apptools, overflow
from .coding.gate import CodingSession
from .history import first_answer, history_item
from .mcp.hub import McpHub
from .mcp.session import McpSession
from .store import Session, SessionStore

Send = Callable[[dict], Awaitable[None]]


class Conversation:
    """What one connection holds between frames; ``send`` writes a server frame."""

    def __init__(self, engine: Any, store: SessionStore, send: Send, ready: dict,
                 mcp_hub: McpHub | None = None):
        self.engine, self.store, self.send, self.ready = engine, store, send, ready
        self.session: Session | None = None
        self.draft_settings: dict = {}  # settings of a session not written yet
        self.next_turn: dict = {}  # sampling for the next turn only
        self.app_context: dict | None = None
        self.task: asyncio.Task | None = None  # the running turn
        self.coding = CodingSession(send)  # off until the page names a workspace
        self.mcp = McpSession(send, mcp_hub, self.coding)  # mlxbun.yaml's MCP servers

    # -- state ----------------------------------------------------------------------------
    @property
    def settings(self) -> dict:
        return self.session.settings if self.session else self.draft_settings

    def update_settings(self, values: dict) -> None:
        if self.session is not None:
            self.session.update_settings(values)
        else:
            self.draft_settings.update(values)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def idle_required(self) -> None:
        if self.running:
            raise BadRequest("a turn is running: abort it first")

    def turn_session(self) -> Session:
        """The session a running turn writes to: its first save opened it, and nothing
        replaces it while the turn runs (every session change waits for idle)."""
        if self.session is None:
            raise RuntimeError("a turn is writing but no session is open")
        return self.session

    def active_path(self) -> str:
        if self.session is None:
            raise BadRequest("no session is open")
        return str(self.session.path)

    # -- what a turn sends and saves --------------------------------------------------------
    def request_body(self, messages: list) -> dict:
        """The OpenAI chat body of a turn: the settings, the page context, the app tools."""
        s = self.settings
        system = "\n\n".join(x for x in (s.get("systemPrompt"),
                                         apptools.ambient_line(self.app_context),
                                         self.coding.system_line()) if x)
        if system:
            messages = [{"role": "system", "content": system}] + messages
        tools = apptools.AGENT_TOOLS + self.coding.tools() + self.mcp.tools()
        body = {"messages": messages, "tools": tools, "stream": True,
                **(s.get("sampling") or {}), **self.next_turn}
        if s.get("thinking") is not None:
            body["chat_template_kwargs"] = {"enable_thinking": s["thinking"]}
        if s.get("adapter"):
            body["adapter"] = s["adapter"]
        if s.get("curve"):  # a drawn curve replaces the temperature sampler (engine/hlg.py)
            body["hlg"] = {"points": s["curve"]["points"]}
        return body

    @staticmethod
    def model_messages(entries: list) -> list:
        return [dict(e["message"]) for e in entries]

    async def save(self, message: dict, parent_id: str | None, meta: dict | None = None) -> dict:
        """Add ``message`` under ``parent_id``; the first message writes the session."""
        session, created = self.session, self.session is None
        if session is None:
            session = self.session = self.store.create({"model": self.ready.get("model")})
            session.update_settings({k: v for k, v in self.draft_settings.items() if v is not None})
        entry = session.add_message(message, parent_id, meta)
        if created:
            await self.send_sessions()
        return entry

    # -- server frames ------------------------------------------------------------------
    async def send_state(self) -> None:
        await self.send_settings()
        await self.send_history()
        await self.send_sessions()
        await self.send_context(await self.count_tokens())

    async def send_settings(self) -> None:
        s = self.settings
        await self.send({"type": "settings", "systemPrompt": s.get("systemPrompt"),
                         "thinking": s.get("thinking"), "sampling": s.get("sampling") or {},
                         "nextTurn": self.next_turn, "adapter": s.get("adapter"),
                         "overflow": overflow.policy_of(s), "curve": s.get("curve")})

    async def send_history(self) -> None:
        session = self.session
        if session is None:
            await self.send({"type": "history", "items": []})
            return
        branch = session.branch()
        await self.send({"type": "history", "items": [history_item(session, e) for e in branch]})
        answer = next((e for e in reversed(branch)
                       if e["message"].get("role") == "assistant"), None)
        if answer is not None:  # the answer regenerate would replace
            first = first_answer(session, answer["id"])
            sibs = session.siblings(first)
            await self.send({"type": "siblings", "entryId": first, "index": sibs.index(first),
                             "count": len(sibs), "siblingIds": sibs})

    async def send_sessions(self) -> None:
        await self.send({"type": "sessions", "items": self.store.summaries(),
                         "activePath": str(self.session.path) if self.session else None})

    async def send_context(self, tokens: int) -> None:
        window = self.engine.model.context_window
        policy = overflow.policy_of(self.settings)
        frame = {"type": "context", "tokens": tokens, "contextWindow": window,
                 "percent": round(100.0 * tokens / window, 1) if window else None,
                 "overflow": policy}
        if warning := overflow.warning(tokens, overflow.window(self.engine), self.settings):
            frame["warning"] = warning
        await self.send(frame)

    async def count_tokens(self) -> int:
        """The open branch's prompt tokens as the next turn would send them (0: unknown)."""
        if self.session is None or not self.session.branch():
            return 0
        try:
            body = self.request_body(self.model_messages(self.session.branch()))
            req = self.engine.parse_chat(body)
            return await self.engine.count_prompt_tokens(req)
        except APIError:  # e.g. images for a model without vision: the count is unknown
            return 0
