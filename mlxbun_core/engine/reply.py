"""A whole reply gathered from events, for non-streaming answers on any surface."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import APIError
from ..events import Content, Done, Event, Finish, Reasoning, ToolCall, ToolCallEvent


@dataclass
class Reply:
    finish: Finish
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def gather(events: Iterable[Event]) -> Reply:
    """Fold events into a Reply; a generation failure raises a 500 with its message."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCall] = []
    finish: Finish | None = None
    for ev in events:
        if isinstance(ev, Content):
            content.append(ev.text)
        elif isinstance(ev, Reasoning):
            reasoning.append(ev.text)
        elif isinstance(ev, ToolCallEvent):
            calls.append(ev.call)
        elif isinstance(ev, Done):
            finish = ev.finish
    if finish is None or finish.reason == "cancelled":
        raise APIError("generation was cancelled")
    if finish.reason == "error":
        raise APIError(finish.error or "generation failed")
    return Reply(finish, "".join(content), "".join(reasoning), calls)
