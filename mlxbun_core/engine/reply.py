"""A whole reply gathered from events, for non-streaming answers on any surface."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import APIError
from ..events import Content, Done, Event, Finish, Reasoning, ToolCall, ToolCallEvent


@dataclass
class Reply:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish: Finish | None = None


def gather(events: Iterable[Event]) -> Reply:
    """Fold events into a Reply; a generation failure raises a 500 with its message."""
    reply = Reply()
    content: list[str] = []
    reasoning: list[str] = []
    for ev in events:
        if isinstance(ev, Content):
            content.append(ev.text)
        elif isinstance(ev, Reasoning):
            reasoning.append(ev.text)
        elif isinstance(ev, ToolCallEvent):
            reply.tool_calls.append(ev.call)
        elif isinstance(ev, Done):
            reply.finish = ev.finish
    reply.content, reply.reasoning = "".join(content), "".join(reasoning)
    if reply.finish is None or reply.finish.reason == "cancelled":
        raise APIError("generation was cancelled")
    if reply.finish.reason == "error":
        raise APIError(reply.finish.error or "generation failed")
    return reply
