"""One chat turn through the engine: stream the reply, run app tools, answer again.

A turn uses the same path as every HTTP surface (``engine.parse_chat`` →
``engine.start`` → ``Generation.events()``), so it batches with API traffic and
reports the lane it really ran on. Abort is ``Generation.cancel()``: the engine
stops within a decode step and the partial answer is kept.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Optional

from ..errors import APIError
from ..events import Admitted, Content, Done, Reasoning, ToolCallEvent
from . import apptools

if TYPE_CHECKING:
    from .agent import ChatAgent

MAX_TOOL_ROUNDS = 4  # generations per turn that may end in app-tool calls


def tool_call_json(call) -> dict:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


class Turn:
    """A turn of ``agent``'s open session; ``body`` is the OpenAI chat body it sends."""

    def __init__(self, agent: "ChatAgent", body: dict):
        self.agent, self.body = agent, body
        self.gen = None
        self.aborted = False
        self.lane: Optional[str] = None

    def abort(self) -> None:
        self.aborted = True
        if self.gen is not None:
            self.gen.cancel()

    async def start(self) -> bool:
        """Start the first generation; a refusal (4xx, a drain) is an error frame, False."""
        try:
            self.gen = await self.agent.engine.start(self.agent.engine.parse_chat(self.body))
        except APIError as exc:
            await self.agent.send({"type": "error", "message": exc.message,
                                   "status": exc.status})
            return False
        return True

    async def run(self, parent_id: str) -> None:
        """Stream generations until an answer, an abort or the tool-round cap; then turn_end."""
        agent = self.agent
        await agent.send({"type": "turn_start"})
        finish = None
        try:
            finish = await self._rounds(parent_id)
        except APIError as exc:  # a store cap, a refused follow-up generation
            self.abort()
            await agent.send({"type": "error", "message": exc.message, "status": exc.status})
        usage = finish.usage if finish else None
        reason = "cancelled" if self.aborted else (finish.reason if finish else "error")
        await agent.send({"type": "turn_end", "lane": self.lane or (usage.lane if usage else None),
                          "finish": reason, "usage": usage.openai() if usage else None})
        if usage is not None:
            await agent.send_context(usage.prompt_tokens + usage.completion_tokens)

    async def _rounds(self, parent_id: str):
        finish = None
        for round_no in range(MAX_TOOL_ROUNDS + 1):
            finish, entry = await self._stream(parent_id)
            calls = entry["message"].get("tool_calls") if entry else None
            if (self.aborted or finish.reason != "tool_calls" or not calls
                    or round_no == MAX_TOOL_ROUNDS):
                return finish
            leaf = await self._run_tools(calls, entry["id"])
            follow = self.agent.session.branch(leaf)[-(len(calls) + 1):]
            self.body["messages"] = self.body["messages"] + self.agent.model_messages(follow)
            parent_id = leaf
            self.gen = await self.agent.engine.start(self.agent.engine.parse_chat(self.body))
            if self.aborted:  # the stop button won the race with the new generation
                self.gen.cancel()
        return finish

    async def _stream(self, parent_id: str):
        """One generation: deltas out, then the assistant message saved (even partial)."""
        text, reasoning, calls, finish = [], [], [], None
        async for ev in self.gen.events():
            if isinstance(ev, Content):
                text.append(ev.text)
                await self.agent.send({"type": "text_delta", "delta": ev.text})
            elif isinstance(ev, Reasoning):
                reasoning.append(ev.text)
                await self.agent.send({"type": "thinking_delta", "delta": ev.text})
            elif isinstance(ev, ToolCallEvent):
                calls.append(tool_call_json(ev.call))
            elif isinstance(ev, Admitted):
                self.lane = ev.lane
            elif isinstance(ev, Done):
                finish = ev.finish
        if finish.reason == "error":
            await self.agent.send({"type": "error", "message": finish.error or "generation failed"})
        message = {"role": "assistant", "content": "".join(text)}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        if finish.reason == "error" and not (text or reasoning or calls):
            return finish, None  # nothing to keep; the user may regenerate
        meta = {"lane": finish.usage.lane, "finish": "cancelled" if self.aborted else finish.reason,
                "usage": finish.usage.openai()}
        return finish, await self.agent.save(message, parent_id, meta)

    async def _run_tools(self, calls: list, parent_id: str) -> str:
        """Run each app tool call, tell the browser, save the results; the new leaf's id."""
        agent = self.agent
        for call in calls:
            fn = call["function"]
            await agent.send({"type": "tool_start", "callId": call["id"], "tool": fn["name"],
                              "args": fn["arguments"]})
            frame = None
            try:
                args = apptools.parse_arguments(fn["arguments"])
                result, frame = apptools.run_tool(fn["name"], args, agent.app_context)
                ok = True
            except apptools.ToolFailed as exc:
                result, ok = {"error": str(exc)}, False
            if frame is not None:
                await agent.send(frame)
            await agent.send({"type": "tool_end", "callId": call["id"], "ok": ok, "result": result})
            entry = await agent.save({"role": "tool", "tool_call_id": call["id"], "name": fn["name"],
                                      "content": json.dumps(result, ensure_ascii=False)},
                                     parent_id, {"ok": ok})
            parent_id = entry["id"]
        return parent_id
