"""What one /ws/chat connection is: a :class:`~.conversation.Conversation` and the handlers
of its client frames, one group per concern.

The transport hands client frames (dicts) to :meth:`ChatAgent.handle` and gives the
agent a ``send`` coroutine for server frames. A frame ``{"type": T, ...}`` goes to the
group's ``on_T``: settings and the page context (:mod:`.settings_frames`), sessions
(:mod:`.session_frames`), turns (:mod:`.turn_frames`, which run :mod:`.turn`, whose
tool rounds run :mod:`.apptools`), once :mod:`.frames` has checked its fields. Client
mistakes become ``error`` frames; the connection stays usable.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import APIError, BadRequest
from . import frames
from .coding.frames import CodingFrames
from .conversation import Conversation, Send
from .session_frames import SessionFrames
from .settings_frames import SettingsFrames
from .store import SessionStore
from .turn_frames import TurnFrames

log = logging.getLogger("mlxbun.webchat")

Handler = Callable[[dict], Awaitable[None]]


class ChatAgent:
    """The web chat's agent for one connection."""

    def __init__(self, engine: Any, store: SessionStore, send: Send, ready: dict,
                 coding_allowed: bool = False, mcp_hub: Any = None):
        self.conversation = Conversation(engine, store, send, ready, mcp_hub)
        self.conversation.coding.allowed = coding_allowed  # loopback clients only
        self.turns = TurnFrames(self.conversation)
        groups = (SettingsFrames(self.conversation), SessionFrames(self.conversation), self.turns,
                  CodingFrames(self.conversation))
        self.handlers: dict[str, Handler] = {
            name[len("on_"):]: getattr(group, name)
            for group in groups for name in dir(group) if name.startswith("on_")}

    async def hello(self) -> None:
        conv = self.conversation
        await conv.send({"type": "ready", **conv.ready})
        await conv.coding.send_state()
        await conv.coding.send_approvals()
        await conv.mcp.send_status(always=True)
        await conv.send_state()

    async def close(self) -> None:
        """The client left: stop the turn (its partial answer is saved) and wait for it."""
        await self.turns.close()

    async def handle(self, frame: Any) -> None:
        """Dispatch one client frame once its fields are checked (:mod:`.frames`); client
        mistakes are answered with an error frame."""
        kind = frame.get("type") if isinstance(frame, dict) else None
        send = self.conversation.send
        try:
            handler = self.handlers.get(frames.check(frame))
            if handler is None:
                raise BadRequest(f"unknown frame type {kind!r}")
            await handler(frame)
        except APIError as exc:
            await send({"type": "error", "message": exc.message, "status": exc.status})
        except Exception:  # a bug or a disk error must not end the connection
            log.exception("web chat frame %r failed", kind)
            await send({"type": "error", "message": f"{kind} failed; see the server log",
                        "status": 500})
