"""A whole reply gathered from events, for non-streaming answers on any surface."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import APIError, Overloaded
from ..events import Content, Done, Event, Finish, Reasoning, ToolCall, ToolCallEvent
from .memory import DEVICE_FAULT


@dataclass
class Reply:
    finish: Finish
    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


def failure(finish: Finish) -> APIError:
    """A failed generation as its surface answers it when nothing was sent yet: a 503
    with ``Retry-After`` when it may be sent again (memory, a restarting engine), else a
    500 with its message."""
    message = finish.error or "generation failed"
    retry = finish.retry
    if retry is not None:
        return Overloaded(message, retry.after, retry.code,
                          restarting=retry.code == DEVICE_FAULT)
    return APIError(message)


def gather(events: Iterable[Event]) -> Reply:
    """Fold events into a Reply; a generation failure raises a 500 with its message (a
    503 with ``Retry-After`` when it may be sent again)."""
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
        raise failure(finish)
    return Reply(finish, "".join(content), "".join(reasoning), calls)
