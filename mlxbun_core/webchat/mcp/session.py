"""One chat connection's view of the MCP servers: the tools a turn offers, each call behind
the coding tools' approval card, and the ``mcp_status`` frame that says how the servers are.

Approvals reuse :class:`~..coding.gate.CodingSession`'s queue: a call's
:class:`~..coding.gate.Waiting` sits beside the coding tools' calls, so one ``approval``
frame answers both kinds, an abort denies both, and "always allow" is kept by the same
store under the namespaced name (``server__tool``). Loopback clients only, like the
coding tools: another client is offered none, and its turns start no server.
"""

from __future__ import annotations

import asyncio
import json
import logging

from .. import approvals
from ..apptools import ToolFailed, parse_arguments
from ..coding import shown
from ..coding.gate import CodingSession, Send, Waiting
from .client import McpServer
from .hub import McpHub

log = logging.getLogger("mlxbun.webchat")
LOOPBACK_ONLY = "MCP tools answer loopback clients only"
MAX_PREVIEW = 16 * 1024  # characters of a call's arguments the card shows


class McpSession:
    """The MCP tools as one connection sees them (``hub`` None or empty: none)."""

    def __init__(self, send: Send, hub: McpHub | None, coding: CodingSession):
        self.send, self.hub, self.coding = send, hub, coding
        self.shown: list[dict] | None = None  # the status last sent

    @property
    def active(self) -> bool:
        return bool(self.hub) and self.coding.allowed

    def tools(self) -> list[dict]:
        if not self.active or self.hub is None:
            return []
        return [tool.function for tool in self.hub.tools().values()]

    def handles(self, name: str) -> bool:
        return self.hub is not None and self.hub.server_of(name) is not None

    async def prepare(self) -> None:
        """Before a turn: start the servers that are due, then say what changed."""
        if self.active and self.hub is not None:
            await self.hub.prepare()
            await self.send_status()

    async def send_status(self, always: bool = False) -> None:
        if not self.active or self.hub is None:
            return
        status = self.hub.status()
        if always or status != self.shown:
            self.shown = status
            await self.send({"type": "mcp_status", "servers": status})

    # -- approvals ----------------------------------------------------------------------------
    async def announce(self, calls: list[dict]) -> None:
        """Show a card for every MCP call of one model message that is not always allowed."""
        if not self.active or self.hub is None:
            return
        allowed = approvals.approvals(self.coding.home)
        asked = False
        for call in calls:
            name = call["function"]["name"]
            server = self.hub.server_of(name)
            tool = self.hub.tools().get(name)
            if server is None or tool is None or name in allowed:
                continue  # run() says why an unknown tool cannot run
            waiting = Waiting(name, {})
            self.coding.waiting[call["id"]] = waiting
            asked = True
            try:
                waiting.args = parse_arguments(call["function"]["arguments"])
            except ToolFailed as exc:
                waiting.error = str(exc)
                continue
            shown_args = json.dumps(waiting.args, ensure_ascii=False, indent=2)
            preview = {"server": server.spec.name, "tool": tool.remote,
                       "where": shown.line(server.spec.where), "timeout": server.spec.timeout,
                       "arguments": shown.text(shown_args[:MAX_PREVIEW])}
            await self.send({"type": "tool_approval_request", "callId": call["id"],
                             "tool": name, "args": waiting.args, "preview": preview,
                             "approvalToken": waiting.token})
        if asked:
            await self.coding.send_queue()
            await self.coding.send_state()

    # -- running ------------------------------------------------------------------------------
    async def run(self, call: dict) -> object:
        """Run one MCP call once approved; a refusal, denial or failure is a ToolFailed."""
        call_id, name = call["id"], call["function"]["name"]
        server = self.hub.server_of(name) if self.hub is not None else None
        try:
            if not self.coding.allowed:
                raise ToolFailed(LOOPBACK_ONLY)
            tool = self.hub.tools().get(name) if self.hub is not None else None
            if server is None or tool is None:
                why = server.error if server is not None and server.error else "no such tool"
                raise ToolFailed(f"{name} is not available: {why}")
            waiting = self.coding.waiting.get(call_id)
            if waiting is None:  # always allowed
                args = parse_arguments(call["function"]["arguments"])
            else:
                args = await self._approved(waiting)
            result = await self._call(server, call_id, tool, args)
            await self.send({"type": "tool_update", "callId": call_id, "kind": "text",
                             "chunk": shown.text(str(result["content"])[:4096])})
            return result
        finally:
            if self.coding.waiting.pop(call_id, None) is not None:
                await self.coding.send_queue()
                await self.coding.send_state()
            await self.send_status()  # a server that died under the call is reported now

    @staticmethod
    async def _approved(waiting: Waiting) -> dict:
        if waiting.error is not None:
            raise ToolFailed(waiting.error)
        answer = await waiting.decision
        if answer["decision"] != "allow":
            reason = answer.get("reason")
            raise ToolFailed("the user denied this call" + (f" ({reason})" if reason else ""))
        edited = answer.get("edited")
        return edited if isinstance(edited, dict) else waiting.args

    async def _call(self, server: McpServer, call_id: str, tool, args: dict) -> dict:
        """The call as a task the turn's stop button cancels (``CodingSession.stop``)."""
        log.info("web chat: mcp call %s", tool.name)
        task = asyncio.create_task(server.call(tool, args))
        self.coding.command = task
        try:
            return await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise  # the turn itself is being cancelled
            raise ToolFailed("the call was stopped") from None
        finally:
            self.coding.command = None
