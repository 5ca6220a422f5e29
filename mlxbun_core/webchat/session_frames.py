"""Client frames about sessions: list, start, open, fork and delete them, and move to a
sibling answer. What changes the open session waits until no turn is running."""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..errors import BadRequest
from .conversation import Conversation

SETTLE_S = 3.0  # how long opening a session waits for a turn still answering in it


class SessionFrames:
    """``list_sessions``, ``new_session``, ``open_session``, ``fork_session``,
    ``delete_session``, ``switch_sibling``."""

    def __init__(self, conversation: Conversation):
        self.conv = conversation

    async def on_list_sessions(self, frame: dict) -> None:
        await self.conv.send_sessions()

    async def on_new_session(self, frame: dict) -> None:
        conv = self.conv
        conv.idle_required()
        conv.draft_settings = dict(conv.settings)  # a new chat keeps the current settings
        conv.session = None
        await conv.send_state()

    async def on_open_session(self, frame: dict) -> None:
        conv = self.conv
        conv.idle_required()
        target = conv.store.resolve(frame.get("path"))
        await self._settle(target)
        conv.session = conv.store.open(str(target))
        await conv.send_state()

    async def _settle(self, path: Path) -> None:
        """Wait (briefly) for a turn still answering in ``path``: a reloaded page's old
        connection is stopping it, and its last save is what the new page should show."""
        task = self.conv.store.turns.get(path)
        if task is not None and task is not self.conv.task and not task.done():
            await asyncio.wait({task}, timeout=SETTLE_S)

    async def on_fork_session(self, frame: dict) -> None:
        conv = self.conv
        conv.idle_required()
        path = frame.get("path") or conv.active_path()
        conv.session = conv.store.fork(path, frame.get("entryId"))
        await conv.send_state()

    async def on_delete_session(self, frame: dict) -> None:
        conv = self.conv
        target = conv.store.resolve(frame.get("path"))
        if conv.session is not None and conv.session.path.resolve() == target:
            conv.idle_required()
            conv.draft_settings, conv.session = dict(conv.session.settings), None
            conv.store.delete(str(target))
            await conv.send_state()
        else:
            conv.store.delete(str(target))
            await conv.send_sessions()

    async def on_switch_sibling(self, frame: dict) -> None:
        conv = self.conv
        conv.idle_required()
        entry_id = frame.get("entryId")
        if (conv.session is None or not isinstance(entry_id, str)
                or entry_id not in conv.session.messages):
            raise BadRequest("entryId must name a message of the open session")
        conv.session.set_leaf(conv.session.newest_leaf_under(entry_id))
        await conv.send_history()
