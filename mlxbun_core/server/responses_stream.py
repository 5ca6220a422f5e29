"""The output side of POST /v1/responses: output items, the response envelope, and the
streamed event sequence (``response.created`` … ``response.completed``).

A ``reasoning`` item appears only when the model thought; its text is the summary.
"""

from __future__ import annotations

from .common import KEEPALIVE, new_id, sse_event


def usage(u) -> dict:
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def reasoning_item(text: str, rid: str | None = None) -> dict:
    return {"id": rid or new_id("rs_"), "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}] if text else []}


def message_item(text: str | None, mid: str | None = None, status: str = "completed") -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [],
                                        "logprobs": []}]
    return {"id": mid or new_id("msg_"), "type": "message", "role": "assistant",
            "status": status, "content": content}


def call_item(call, fid: str | None = None, status: str = "completed", arguments=None) -> dict:
    return {"id": fid or new_id("fc_"), "type": "function_call", "call_id": call.id,
            "name": call.name, "status": status,
            "arguments": call.arguments if arguments is None else arguments}


def status_of(finish) -> str:
    return "incomplete" if finish.reason == "length" else "completed"


def envelope(model_id: str, rid: str, created: int, body: dict, status: str, output: list,
             finish=None, error=None) -> dict:
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


async def stream(engine, job, make_envelope, on_complete):
    """SSE frames for ``job``. ``make_envelope(status, output, finish=None, error=None)``
    builds the response object; ``on_complete(output, response)`` runs once the final
    response exists (not after a failure)."""
    seq = 0
    output: list = []  # finished items, in order
    cur = None  # the open item: {"item": dict, "text": [str]}

    def ev(kind, **data):
        nonlocal seq
        seq += 1
        return sse_event(kind, {"type": kind, "sequence_number": seq - 1, **data})

    def where():
        return {"item_id": cur["item"]["id"], "output_index": len(output)}

    def open_item(item):
        nonlocal cur
        frames = close()
        cur = {"item": item, "text": []}
        frames.append(ev("response.output_item.added", output_index=len(output), item=item))
        if item["type"] == "reasoning":
            frames.append(ev("response.reasoning_summary_part.added", **where(),
                             summary_index=0, part={"type": "summary_text", "text": ""}))
        elif item["type"] == "message":
            frames.append(ev("response.content_part.added", **where(), content_index=0,
                             part={"type": "output_text", "text": "", "annotations": []}))
        return frames

    def close():
        nonlocal cur
        if cur is None:
            return []
        item, text, frames = cur["item"], "".join(cur["text"]), []
        if item["type"] == "reasoning":
            part = {"type": "summary_text", "text": text}
            item = reasoning_item(text, item["id"])
            frames += [ev("response.reasoning_summary_text.done", **where(),
                          summary_index=0, text=text),
                       ev("response.reasoning_summary_part.done", **where(),
                          summary_index=0, part=part)]
        elif item["type"] == "message":
            item = message_item(text, item["id"])
            frames += [ev("response.output_text.done", **where(), content_index=0,
                          text=text, logprobs=[]),
                       ev("response.content_part.done", **where(), content_index=0,
                          part=item["content"][0])]
        frames.append(ev("response.output_item.done", output_index=len(output), item=item))
        output.append(item)
        cur = None
        return frames

    def message_text(t):
        frames = [] if cur and cur["item"]["type"] == "message" else open_item(
            message_item(None, status="in_progress"))
        if not t:
            return frames
        cur["text"].append(t)
        return frames + [ev("response.output_text.delta", **where(), content_index=0,
                            delta=t, logprobs=[])]

    yield ev("response.created", response=make_envelope("in_progress", []))
    yield ev("response.in_progress", response=make_envelope("in_progress", []))
    async for kind, payload in engine.events(job):
        frames = []
        if kind == "reasoning" and payload:
            if not cur or cur["item"]["type"] != "reasoning":
                frames += open_item({"id": new_id("rs_"), "type": "reasoning", "summary": []})
            cur["text"].append(payload)
            frames.append(ev("response.reasoning_summary_text.delta", **where(),
                             summary_index=0, delta=payload))
        elif kind == "content" and payload:
            frames += message_text(payload)  # the tool parser drops whitespace around a call
        elif kind == "tool_call":
            frames += open_item(call_item(payload, status="in_progress", arguments=""))
            frames += [ev("response.function_call_arguments.delta", **where(),
                          delta=payload.arguments),
                       ev("response.function_call_arguments.done", **where(),
                          name=payload.name, arguments=payload.arguments)]
            cur["item"] = call_item(payload, cur["item"]["id"])
            frames += close()
        elif kind == "keepalive":
            frames.append(KEEPALIVE)
        elif kind == "done":
            if payload.reason in ("error", "cancelled"):
                error = {"code": "server_error",
                         "message": payload.error or "generation cancelled"}
                yield ev("response.failed", response=make_envelope("failed", output, error=error))
                return
            if not any(it["type"] in ("message", "function_call")
                       for it in output + ([cur["item"]] if cur else [])):
                frames += message_text("")
            frames += close()
            status = status_of(payload)
            response = make_envelope(status, output, payload)
            on_complete(output, response)
            frames.append(ev(f"response.{status}", response=response))
        for frame in frames:
            yield frame
