"""One chat turn through the engine: stream the reply, run app tools, answer again.

A turn uses the same path as every HTTP surface (``engine.parse_chat`` →
``engine.start`` → ``Generation.events()``), so it batches with API traffic and
reports the lane it really ran on. Abort is ``Generation.cancel()``: the engine
stops within a decode step and the partial answer is kept.

The answer is saved as it streams (:class:`Draft`): its first text is written at once,
marked ``interrupted``, then what follows at most every :data:`SAVE_EVERY_S`; the
finished answer replaces it. A reload, a crash or a killed server therefore leaves the
partial answer on disk, marked, for the page to show with Regenerate.
"""

from __future__ import annotations

import json
import time
from typing import Any

from ..errors import APIError
from ..events import Admitted, Content, Done, Finish, Reasoning, ToolCall, ToolCallEvent
from . import apptools
from .conversation import Conversation

MAX_TOOL_ROUNDS = 4  # generations per turn that may end in app-tool calls
SAVE_EVERY_S = 0.5  # how often a streaming answer's new text is appended to its session
INTERRUPTED = "interrupted"  # meta.finish of an answer whose turn has not ended (yet)


class Draft:
    """One streaming answer, saved as it goes: the first text at once (a message marked
    ``interrupted``), then the text since the last save at most every ``every_s``."""

    def __init__(self, conv: Conversation, parent_id: str, every_s: float = SAVE_EVERY_S):
        self.conv, self.parent_id, self.every_s = conv, parent_id, every_s
        self.id: str | None = None
        self.content: list[str] = []  # text not saved yet
        self.reasoning: list[str] = []
        self.saved_at = 0.0

    def add(self, content: str = "", reasoning: str = "") -> None:
        if content:
            self.content.append(content)
        if reasoning:
            self.reasoning.append(reasoning)
        if self.id is None or time.monotonic() - self.saved_at >= self.every_s:
            self.save()

    def save(self) -> None:
        content, reasoning = "".join(self.content), "".join(self.reasoning)
        if not (content or reasoning):
            return
        session = self.conv.turn_session()
        if self.id is None:
            message = {"role": "assistant", "content": content}
            if reasoning:
                message["reasoning_content"] = reasoning
            self.id = session.add_message(message, self.parent_id, {"finish": INTERRUPTED})["id"]
        else:
            session.append_text(self.id, content, reasoning)
        self.content, self.reasoning = [], []
        self.saved_at = time.monotonic()

    def finish(self, message: dict, meta: dict) -> dict:
        """Save the finished answer (in place of the partial one, if any was written)."""
        session = self.conv.turn_session()
        if self.id is None:
            return session.add_message(message, self.parent_id, meta)
        return session.replace_message(self.id, message, meta)


def tool_call_json(call: ToolCall) -> dict:
    return {"id": call.id, "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


class Turn:
    """A turn of the conversation's open session; ``body`` is the OpenAI chat body it sends."""

    def __init__(self, conv: Conversation, body: dict, dropped: int = 0):
        self.conv, self.body = conv, body
        self.dropped = dropped  # older messages left out to fit the window (overflow.py)
        self.gen: Any = None  # the engine's Generation now streaming
        self.aborted = False
        self.lane: str | None = None

    def abort(self) -> None:
        self.aborted = True
        self.conv.coding.stop("the turn was stopped")
        if self.gen is not None:
            self.gen.cancel()

    async def start(self) -> bool:
        """Start the first generation; a refusal (4xx, a drain) is an error frame, False."""
        try:
            self.gen = await self.conv.engine.start(self.conv.engine.parse_chat(self.body))
        except APIError as exc:
            await self.conv.send({"type": "error", "message": exc.message,
                                  "status": exc.status})
            return False
        return True

    async def run(self, parent_id: str) -> None:
        """Stream generations until an answer, an abort or the tool-round cap; then turn_end."""
        conv = self.conv
        if self.dropped:
            await conv.send({"type": "context_trimmed", "dropped": self.dropped})
        await conv.send({"type": "turn_start"})
        finish = None
        try:
            finish = await self._rounds(parent_id)
        except APIError as exc:  # a store cap, a refused follow-up generation
            self.abort()
            await conv.send({"type": "error", "message": exc.message, "status": exc.status})
        usage = finish.usage if finish else None
        reason = "cancelled" if self.aborted else (finish.reason if finish else "error")
        await conv.send({"type": "turn_end", "lane": self.lane or (usage.lane if usage else None),
                         "finish": reason, "usage": usage.openai() if usage else None})
        if usage is not None:
            await conv.send_context(usage.prompt_tokens + usage.completion_tokens)

    async def _rounds(self, parent_id: str) -> Finish | None:
        finish = None
        for round_no in range(MAX_TOOL_ROUNDS + 1):
            finish, entry = await self._stream(parent_id)
            calls = entry["message"].get("tool_calls") if entry else None
            if (self.aborted or finish.reason != "tool_calls" or entry is None or not calls
                    or round_no == MAX_TOOL_ROUNDS):
                return finish
            leaf = await self._run_tools(calls, entry["id"])
            follow = self.conv.turn_session().branch(leaf)[-(len(calls) + 1):]
            self.body["messages"] = self.body["messages"] + self.conv.model_messages(follow)
            parent_id = leaf
            self.gen = await self.conv.engine.start(self.conv.engine.parse_chat(self.body))
            if self.aborted:  # the stop button won the race with the new generation
                self.gen.cancel()
        return finish

    async def _stream(self, parent_id: str) -> tuple[Finish, dict | None]:
        """One generation: deltas out and saved as they come, then the finished message."""
        text: list[str] = []
        reasoning: list[str] = []
        calls: list[dict] = []
        finish: Finish | None = None
        draft = Draft(self.conv, parent_id)
        async for ev in self.gen.events():
            if isinstance(ev, Content):
                text.append(ev.text)
                draft.add(content=ev.text)
                await self.conv.send({"type": "text_delta", "delta": ev.text})
            elif isinstance(ev, Reasoning):
                reasoning.append(ev.text)
                draft.add(reasoning=ev.text)
                await self.conv.send({"type": "thinking_delta", "delta": ev.text})
            elif isinstance(ev, ToolCallEvent):
                calls.append(tool_call_json(ev.call))
            elif isinstance(ev, Admitted):
                self.lane = ev.lane
            elif isinstance(ev, Done):
                finish = ev.finish
        if finish is None:  # the engine's contract: Done is the last event of every generation
            raise RuntimeError("a generation ended without its done event")
        if finish.reason == "error":
            await self.conv.send({"type": "error", "message": finish.error or "generation failed"})
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
        if reasoning:
            message["reasoning_content"] = "".join(reasoning)
        if calls:
            message["tool_calls"] = calls
        if finish.reason == "error" and not (text or reasoning or calls):
            return finish, None  # nothing to keep; the user may regenerate
        meta: dict[str, Any] = {"lane": finish.usage.lane,
                                "finish": "cancelled" if self.aborted else finish.reason,
                                "usage": finish.usage.openai()}
        if self.dropped:
            meta["trimmed"] = self.dropped
        return finish, draft.finish(message, meta)

    async def _run_tools(self, calls: list, parent_id: str) -> str:
        """Run each app tool call, tell the browser, save the results; the new leaf's id."""
        conv = self.conv
        await conv.coding.announce([c for c in calls if conv.coding.handles(c["function"]["name"])])
        await conv.mcp.announce([c for c in calls if conv.mcp.handles(c["function"]["name"])])
        for call in calls:
            fn = call["function"]
            await conv.send({"type": "tool_start", "callId": call["id"], "tool": fn["name"],
                              "args": fn["arguments"]})
            frame = None
            try:
                if conv.coding.handles(fn["name"]):  # coding/gate.py: may wait for approval
                    result = await conv.coding.run(call)
                elif conv.mcp.handles(fn["name"]):  # mcp/session.py: the same cards
                    result = await conv.mcp.run(call)
                else:
                    args = apptools.parse_arguments(fn["arguments"])
                    result, frame = apptools.run_tool(fn["name"], args, conv.app_context)
                ok = True
            except apptools.ToolFailed as exc:
                result, ok = {"error": str(exc)}, False
            if frame is not None:
                await conv.send(frame)
            await conv.send({"type": "tool_end", "callId": call["id"], "ok": ok, "result": result})
            entry = await conv.save({"role": "tool", "tool_call_id": call["id"], "name": fn["name"],
                                     "content": json.dumps(result, ensure_ascii=False)},
                                    parent_id, {"ok": ok})
            parent_id = entry["id"]
        return parent_id
