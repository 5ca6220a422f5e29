"""The output side of POST /v1/responses: output items, the response envelope, and the
streamed event sequence (``response.created`` … ``response.completed``).

A ``reasoning`` item appears only when the model thought; its text is the summary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...events import (
    Content,
    Event,
    Finish,
    Reasoning,
    ToolCall,
    ToolCallDelta,
    ToolCallEvent,
    ToolCallStart,
    ToolCallWithdrawn,
    Usage,
)
from ..common import new_id, sse_event
from ..generation import FrameWriter


def usage(u: Usage) -> dict[str, Any]:
    out = {"input_tokens": u.prompt_tokens,
           "input_tokens_details": {"cached_tokens": u.cached_tokens},
           "output_tokens": u.completion_tokens,
           "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
           "total_tokens": u.prompt_tokens + u.completion_tokens}
    if u.fill is not None:  # forced-token fill (MLXBUN_FILL=strict)
        out["fill"] = u.fill_report()
    if u.speculation is not None:  # our extension, as on the OpenAI surfaces
        out["speculation"] = dict(u.speculation)
    return out


def reasoning_item(text: str, rid: str | None = None) -> dict[str, Any]:
    return {"id": rid or new_id("rs_"), "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}] if text else []}


def message_item(text: str | None, mid: str | None = None,
                 status: str = "completed") -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
    return {"id": mid or new_id("msg_"), "type": "message", "role": "assistant",
            "status": status, "content": content}


def call_item(call: ToolCall, fid: str | None = None, status: str = "completed",
              arguments: str | None = None) -> dict[str, Any]:
    return {"id": fid or new_id("fc_"), "type": "function_call", "call_id": call.id,
            "name": call.name, "status": status,
            "arguments": call.arguments if arguments is None else arguments}


def status_of(finish: Finish) -> str:
    return "incomplete" if finish.reason == "length" else "completed"


def envelope(model_id: str, rid: str, created: int, body: dict[str, Any], status: str,
             output: list[dict[str, Any]], finish: Finish | None = None,
             error: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``response`` object, echoing the request's settings."""
    incomplete = ({"reason": "max_output_tokens"} if finish is not None
                  and finish.reason == "length" else None)
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)
             and t.get("type") == "function"]
    return {"id": rid, "object": "response", "created_at": created, "status": status,
            "error": error, "incomplete_details": incomplete,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens", body.get("max_tokens")),
            "model": model_id, "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "store": body.get("store", True), "temperature": body.get("temperature"),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"), "tools": tools,
            "top_p": body.get("top_p"), "truncation": "disabled",
            "usage": usage(finish.usage) if finish is not None else None,
            "metadata": body.get("metadata") or {}}


class ResponseFrames(FrameWriter):
    """The Responses event sequence. ``make_envelope(status, output, finish=None,
    error=None)`` builds the response object; ``on_complete(output, response)`` runs
    once the final response exists (not after a failure).

    A tool call streams as a ``function_call`` item: ``output_item.added`` (name, empty
    arguments), ``function_call_arguments.delta`` pieces, then ``.done`` and
    ``output_item.done``. A streamed call that is withdrawn (the budget cut it) ends
    with ``output_item.done`` at status ``incomplete`` and is left out of the final
    response's ``output`` (so out of a stored response too)."""

    def __init__(self, make_envelope: Callable[..., dict[str, Any]],
                 on_complete: Callable[[list[dict[str, Any]], dict[str, Any]], None]) -> None:
        self.make_envelope, self.on_complete = make_envelope, on_complete
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # finished items, in order
        self.cur: dict[str, Any] | None = None  # the open item: {"item": dict, "text": [str]}
        self.index = 0  # the open (or next) item's output_index; withdrawn items count
        self.streaming: str | None = None  # the call id of the open function_call item

    def ev(self, kind: str, **data: object) -> bytes:
        self.seq += 1
        return sse_event(kind, {"type": kind, "sequence_number": self.seq - 1, **data})

    def _open(self) -> dict[str, Any]:
        """The open item (its callers open one first)."""
        assert self.cur is not None
        return self.cur

    def where(self) -> dict[str, Any]:
        return {"item_id": self._open()["item"]["id"], "output_index": self.index}

    def open_item(self, item: dict[str, Any]) -> list[bytes]:
        frames = self.close()
        self.cur = {"item": item, "text": []}
        frames.append(self.ev("response.output_item.added", output_index=self.index,
                              item=item))
        if item["type"] == "reasoning":
            frames.append(self.ev("response.reasoning_summary_part.added", **self.where(),
                                  summary_index=0, part={"type": "summary_text", "text": ""}))
        elif item["type"] == "message":
            frames.append(self.ev("response.content_part.added", **self.where(), content_index=0,
                                  part={"type": "output_text", "text": "", "annotations": []}))
        return frames

    def close(self) -> list[bytes]:
        if self.cur is None:
            return []
        item, text = self.cur["item"], "".join(self.cur["text"])
        frames: list[bytes] = []
        if item["type"] == "reasoning":
            part = {"type": "summary_text", "text": text}
            item = reasoning_item(text, item["id"])
            frames += [self.ev("response.reasoning_summary_text.done", **self.where(),
                               summary_index=0, text=text),
                       self.ev("response.reasoning_summary_part.done", **self.where(),
                               summary_index=0, part=part)]
        elif item["type"] == "message":
            item = message_item(text, item["id"])
            frames += [self.ev("response.output_text.done", **self.where(), content_index=0,
                               text=text, logprobs=[]),
                       self.ev("response.content_part.done", **self.where(), content_index=0,
                               part=item["content"][0])]
        frames.append(self.ev("response.output_item.done", output_index=self.index,
                              item=item))
        if item.get("status") != "incomplete":
            self.output.append(item)
        self.index += 1
        self.cur = None
        return frames

    def message_text(self, t: str) -> list[bytes]:
        cur = self.cur
        frames = [] if cur and cur["item"]["type"] == "message" else self.open_item(
            message_item(None, status="in_progress"))
        if not t:
            return frames
        self._open()["text"].append(t)
        return frames + [self.ev("response.output_text.delta", **self.where(), content_index=0,
                                 delta=t, logprobs=[])]

    def opening(self) -> list[bytes]:
        return [self.ev("response.created", response=self.make_envelope("in_progress", [])),
                self.ev("response.in_progress", response=self.make_envelope("in_progress", []))]

    def keepalive(self) -> list[bytes]:
        """Before any output, ``response.in_progress`` again: Codex times a stream by its
        events (an SSE comment does not count) and gives up after 5 minutes, while a CPU
        may read its prompt for longer."""
        if self.output or self.cur is not None:
            return super().keepalive()
        return [self.ev("response.in_progress", response=self.make_envelope("in_progress", []))]

    def event(self, e: Event) -> list[bytes]:
        frames: list[bytes] = []
        if isinstance(e, Reasoning) and e.text:
            if not self.cur or self.cur["item"]["type"] != "reasoning":
                frames += self.open_item({"id": new_id("rs_"), "type": "reasoning", "summary": []})
            self._open()["text"].append(e.text)
            frames.append(self.ev("response.reasoning_summary_text.delta", **self.where(),
                                  summary_index=0, delta=e.text))
        elif isinstance(e, Content) and e.text:
            frames += self.message_text(e.text)  # the tool parser drops whitespace around a call
        elif isinstance(e, ToolCallEvent):
            call = e.call
            if call.id != self.streaming:
                frames += self.open_item(call_item(call, status="in_progress", arguments=""))
                frames.append(self.arguments_delta(call.arguments))
            self.streaming = None
            frames.append(self.ev("response.function_call_arguments.done", **self.where(),
                                  name=call.name, arguments=call.arguments))
            cur = self._open()
            cur["item"] = call_item(call, cur["item"]["id"])
            frames += self.close()
        else:
            frames += self.call_stream(e)
        return frames

    def arguments_delta(self, text: str) -> bytes:
        self._open()["text"].append(text)
        return self.ev("response.function_call_arguments.delta", **self.where(), delta=text)

    def call_stream(self, e: Event) -> list[bytes]:
        """A call as it is written: its item opened, its argument pieces, or withdrawn."""
        if isinstance(e, ToolCallStart):
            self.streaming = e.call_id
            return self.open_item(call_item(ToolCall(e.name, "", e.call_id),
                                            status="in_progress"))
        if isinstance(e, ToolCallDelta) and e.call_id == self.streaming:
            return [self.arguments_delta(e.text)]
        if isinstance(e, ToolCallWithdrawn) and e.call_id == self.streaming:
            self.streaming = None
            cur = self._open()
            cur["item"] = dict(cur["item"], status="incomplete",
                               arguments="".join(cur["text"]))
            return self.close()
        return []

    def done(self, finish: Finish) -> list[bytes]:
        frames: list[bytes] = []
        if not any(it["type"] in ("message", "function_call")
                   for it in self.output + ([self.cur["item"]] if self.cur else [])):
            frames += self.message_text("")
        frames += self.close()
        status = status_of(finish)
        response = self.make_envelope(status, self.output, finish)
        self.on_complete(self.output, response)
        return frames + [self.ev(f"response.{status}", response=response)]

    def failed(self, message: str) -> list[bytes]:
        error = {"code": "server_error", "message": message}
        return [self.ev("response.failed",
                        response=self.make_envelope("failed", self.output, error=error))]
