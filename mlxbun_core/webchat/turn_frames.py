"""Client frames that run turns: a new prompt, an edited prompt sent again, another answer
to a prompt (regenerate), and stop. At most one turn runs per connection; it is started
in the engine before anything is saved, so a refused turn leaves the session as it was."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ..errors import APIError, BadRequest
from .conversation import Conversation
from .fields import image_parts, text_arg
from .overflow import fit
from .turn import Turn

log = logging.getLogger("mlxbun.webchat")


class TurnFrames:
    """``prompt``, ``edit_resend``, ``regenerate``, ``abort``; :meth:`close` when the client
    leaves."""

    def __init__(self, conversation: Conversation):
        self.conv = conversation
        self.turn: Turn | None = None

    async def on_prompt(self, frame: dict) -> None:
        self.conv.idle_required()
        text = text_arg(frame)
        images = image_parts(frame.get("images"))
        if not text.strip() and not images:
            raise BadRequest("the message is empty")
        content = [{"type": "text", "text": text}, *images] if images else text
        parent = self.conv.session.leaf if self.conv.session else None
        await self._begin({"role": "user", "content": content}, parent)

    async def on_edit_resend(self, frame: dict) -> None:
        self.conv.idle_required()
        text = text_arg(frame)
        target = self._user_entry(frame.get("entryId"))
        content = target["message"].get("content")
        if isinstance(content, list):  # keep the attachments, replace the words
            content = [{"type": "text", "text": text},
                       *[p for p in content if isinstance(p, dict) and p.get("type") != "text"]]
        else:
            content = text
        await self._begin({"role": "user", "content": content}, target.get("parentId"))

    async def on_regenerate(self, frame: dict) -> None:
        self.conv.idle_required()
        target = self._user_entry(frame.get("entryId"))
        await self._begin(None, target["id"])

    async def on_abort(self, frame: dict) -> None:
        if self.turn is not None:
            self.turn.abort()

    async def close(self) -> None:
        """The client left: stop the turn (its partial answer is saved) and wait for it."""
        if self.turn is not None:
            self.turn.abort()
        if self.conv.task is not None:
            await asyncio.gather(self.conv.task, return_exceptions=True)

    def _user_entry(self, entry_id: str | None) -> dict:
        branch = self.conv.session.branch() if self.conv.session else []
        users = [e for e in branch if e["message"].get("role") == "user"]
        if entry_id is not None:
            users = [e for e in users if e["id"] == entry_id]
        if not users:
            raise BadRequest("there is no user message to answer again")
        return users[-1]

    async def _begin(self, user_message: dict | None, parent_id: str | None) -> None:
        """Start the engine first (a refusal saves nothing), then save and stream."""
        conv = self.conv
        history = conv.session.branch(parent_id) if (conv.session and parent_id) else []
        messages = conv.model_messages(history)
        if user_message is not None:
            messages.append(user_message)
        await conv.mcp.prepare()  # MCP servers start on first use; their tools join the turn
        messages, dropped = await fit(conv, messages)  # the overflow policy (overflow.py)
        turn = Turn(conv, conv.request_body(messages), dropped)
        conv.next_turn = {}
        if not await turn.start():
            return
        try:
            if user_message is not None:
                parent_id = (await conv.save(user_message, parent_id))["id"]
        except APIError:
            turn.abort()
            raise
        if parent_id is None:  # not reached: a regenerate names its prompt, a prompt was saved
            turn.abort()
            raise BadRequest("there is no user message to answer")
        self.turn = turn
        key = conv.turn_session().path.resolve()
        conv.task = conv.store.turns[key] = asyncio.create_task(self._run(turn, parent_id, key))

    async def _run(self, turn: Turn, parent_id: str, key: Path) -> None:
        conv = self.conv
        try:
            await turn.run(parent_id)
            await conv.send_history()
        except Exception:  # the connection must outlive a bug in one turn
            log.exception("web chat turn failed")
            await conv.send({"type": "error", "message": "the turn failed; see the server log"})
        finally:
            self.turn = None
            if conv.store.turns.get(key) is asyncio.current_task():
                del conv.store.turns[key]
