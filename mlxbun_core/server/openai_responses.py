"""POST /v1/responses — the OpenAI Responses surface.

Input items are translated into the OpenAI chat body shape and run through
``engine.prepare_chat`` like every other surface. ``previous_response_id``
resumes from a per-process :class:`ResponseStore` holding each response's
conversation in chat form (instructions carry forward when omitted; reasoning
is not replayed). A ``reasoning`` output item appears only when the model
thought; its text is the summary.
"""

from __future__ import annotations

from blacksheep import Request

from ..engine.reply import gather
from ..errors import APIError, BadRequest, NotFound
from .common import (collect, guarded, json_response, new_id, now, read_body, sse_event,
                     sse_response, KEEPALIVE)
from .response_store import ResponseStore

# sampler fields and mlx-lm extensions passed through to the chat body as-is
PASSTHROUGH = ("temperature", "top_p", "top_k", "min_p", "xtc_probability", "xtc_threshold",
               "logit_bias", "repetition_penalty", "repetition_context_size",
               "presence_penalty", "presence_context_size", "frequency_penalty",
               "frequency_context_size", "seed", "stop", "chat_template_kwargs",
               "reasoning_effort", "response_format")
TEXT_PARTS = ("input_text", "output_text", "text")


def responses_error(exc: APIError):
    kind = ("not_found_error" if exc.status == 404 else
            "server_error" if exc.status >= 500 else "invalid_request_error")
    return json_response({"error": {"message": exc.message, "type": kind,
                                    "param": None, "code": None}}, exc.status)


# ---------------------------------------------------------------- request side

def _part(part) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in TEXT_PARTS:
        return {"type": "text", "text": str(part.get("text", ""))}
    if kind == "refusal":
        return {"type": "text", "text": str(part.get("refusal", ""))}
    if kind == "input_image":
        url = part.get("image_url")
        if not isinstance(url, str):
            raise BadRequest("input_image needs an image_url (file_id is not supported)",
                             param="input")
        return {"type": "image_url", "image_url": {"url": url}}
    if kind == "input_audio":
        return {"type": "input_audio", "input_audio": part.get("input_audio") or {}}
    raise BadRequest(f"unsupported content part type: {kind!r}", param="input")


def _content(content):
    """Message content as a string, or OpenAI chat parts when media is present."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest("message content must be a string or a list of parts", param="input")
    parts = [_part(p) for p in content]
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _text(content) -> str:
    c = _content(content)
    if not isinstance(c, str):
        raise BadRequest("system/developer content must be text", param="input")
    return c


def translate_input(value) -> tuple[list, list]:
    """``input`` → (system texts, chat messages without the system message)."""
    if isinstance(value, str):
        return [], [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise BadRequest("input must be a string or a list of items", param="input")
    system, msgs = [], []
    for item in value:
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object", param="input")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role in ("system", "developer"):
                system.append(_text(item.get("content")))
            elif role in ("user", "assistant"):
                msgs.append({"role": role, "content": _content(item.get("content"))})
            else:
                raise BadRequest(f"unsupported message role: {role!r}", param="input")
        elif kind == "function_call":
            call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                    "function": {"name": item.get("name", ""),
                                 "arguments": item.get("arguments") or "{}"}}
            last = msgs[-1] if msgs else None
            if last is not None and last["role"] == "assistant" and isinstance(last["content"], str):
                last.setdefault("tool_calls", []).append(call)
            else:
                msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out = item.get("output")
            msgs.append({"role": "tool", "tool_call_id": str(item.get("call_id", "")),
                         "content": out if isinstance(out, str) else _content(out or "")})
        elif kind in ("reasoning", "item_reference"):
            continue  # reasoning is not replayed; references have nothing to resolve against
        else:
            raise BadRequest(f"unsupported input item type: {kind!r}", param="input")
    return system, msgs


def _tools(tools) -> list | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for t in tools:
        if not isinstance(t, dict) or t.get("type") != "function":
            continue  # built-in tools (web_search, file_search, mcp, …) are not ours
        if isinstance(t.get("function"), dict):
            out.append(t)  # already chat-shaped
        elif t.get("name"):
            fn = {"name": t["name"], "description": t.get("description") or "",
                  "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
            out.append({"type": "function", "function": fn})
    return out or None


def _tool_choice(choice):
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and choice.get("name"):
        return {"type": "function", "function": {"name": choice["name"]}}
    return None


def to_chat(body: dict, stored: dict | None) -> tuple[dict, str, list]:
    """Return (chat body, system text, conversation messages to store)."""
    if "input" not in body:
        raise BadRequest("input is required", param="input")
    sys_items, new = translate_input(body["input"])
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("instructions must be a string", param="instructions")
    if instructions is None and stored:
        instructions = stored.get("system") or None
    system = "\n\n".join(t for t in [instructions or ""] + sys_items if t)
    convo = (stored or {}).get("messages", []) + new
    if not convo:
        raise BadRequest("input has no messages", param="input")
    chat = {"messages": ([{"role": "system", "content": system}] if system else []) + convo}
    limit = body.get("max_output_tokens", body.get("max_tokens"))
    if limit is not None:
        chat["max_tokens"] = limit
    for name in PASSTHROUGH:
        if body.get(name) is not None:
            chat[name] = body[name]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        chat.setdefault("reasoning_effort", reasoning["effort"])
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if choice is not None:
            chat["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat, system, convo


# ---------------------------------------------------------------- response side

def _usage(u) -> dict:
    return {"input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def reasoning_item(text: str, rid: str | None = None) -> dict:
    return {"id": rid or new_id("rs_"), "type": "reasoning",
            "summary": [{"type": "summary_text", "text": text}] if text else []}


def message_item(text: str, mid: str | None = None, status: str = "completed") -> dict:
    content = [] if text is None else [{"type": "output_text", "text": text, "annotations": [],
                                        "logprobs": []}]
    return {"id": mid or new_id("msg_"), "type": "message", "role": "assistant",
            "status": status, "content": content}


def call_item(call, fid: str | None = None, status: str = "completed", arguments=None) -> dict:
    return {"id": fid or new_id("fc_"), "type": "function_call", "call_id": call.id,
            "name": call.name, "status": status,
            "arguments": call.arguments if arguments is None else arguments}


def stored_turn(convo: list, output: list) -> list:
    """The conversation plus this response's output as one chat assistant message."""
    text = "".join(p["text"] for it in output if it["type"] == "message" for p in it["content"])
    calls = [{"id": it["call_id"], "type": "function",
              "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in output if it["type"] == "function_call"]
    msg = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return convo + [msg]


def register(app, engine):
    model_id = engine.model.id
    store = ResponseStore()
    app.response_store = store
    app.stats_providers["response_store"] = store.stats

    def envelope(rid, created, body, status, output, finish=None, error=None) -> dict:
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
                "usage": _usage(finish.usage) if finish is not None else None,
                "metadata": body.get("metadata") or {}}

    def status_of(finish) -> str:
        return "incomplete" if finish.reason == "length" else "completed"

    def remember(body, rid, system, convo, output, response):
        if body.get("store", True) is not False:
            store.put(rid, {"system": system, "messages": stored_turn(convo, output),
                            "response": response})

    @guarded(responses_error)
    async def responses(request: Request):
        body = await read_body(request)
        stored = None
        prev = body.get("previous_response_id")
        if prev is not None:
            stored = store.get(prev) if isinstance(prev, str) else None
            if stored is None:
                raise NotFound(f"previous response {prev!r} not found (unknown or expired)",
                               param="previous_response_id")
        chat, system, convo = to_chat(body, stored)
        prepared = await engine.aprepare_chat(chat)
        job = engine.start(prepared.request)
        headers = {"Warning": prepared.warning} if prepared.warning else None
        rid, created = new_id("resp_"), now()
        if body.get("stream"):
            frames = stream(job, body, rid, created, system, convo)
            return sse_response(request, job, frames, headers)
        reply = gather(await collect(request, engine, job))
        output = [reasoning_item(reply.reasoning)] if reply.reasoning else []
        if not reply.tool_calls or reply.content.strip():
            output.append(message_item(reply.content))
        output += [call_item(c) for c in reply.tool_calls]
        response = envelope(rid, created, body, status_of(reply.finish), output, reply.finish)
        remember(body, rid, system, convo, output, response)
        return json_response(response, headers=headers)

    async def stream(job, body, rid, created, system, convo):
        seq = 0
        output: list = []  # finished items, in order
        cur = None  # the open item: {"item": dict, "text": [str]}
        pending = ""  # leading whitespace of a message, dropped if a tool call follows

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

        yield ev("response.created", response=envelope(rid, created, body, "in_progress", []))
        yield ev("response.in_progress", response=envelope(rid, created, body, "in_progress", []))
        async for kind, payload in engine.events(job):
            frames = []
            if kind == "reasoning" and payload:
                if not cur or cur["item"]["type"] != "reasoning":
                    frames += open_item({"id": new_id("rs_"), "type": "reasoning", "summary": []})
                cur["text"].append(payload)
                frames.append(ev("response.reasoning_summary_text.delta", **where(),
                                 summary_index=0, delta=payload))
            elif kind == "content" and payload:
                in_message = cur is not None and cur["item"]["type"] == "message"
                if not in_message and not (pending + payload).strip():
                    pending += payload
                else:
                    frames += message_text(pending + payload)
                    pending = ""
            elif kind == "tool_call":
                pending = ""
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
                    yield ev("response.failed", response=envelope(
                        rid, created, body, "failed", output, error=error))
                    return
                if pending or not any(it["type"] in ("message", "function_call")
                                      for it in output + ([cur["item"]] if cur else [])):
                    frames += message_text(pending)
                frames += close()
                status = status_of(payload)
                response = envelope(rid, created, body, status, output, payload)
                remember(body, rid, system, convo, output, response)
                frames.append(ev(f"response.{status}", response=response))
            for frame in frames:
                yield frame

    def stored_or_404(request: Request) -> str:
        rid = request.route_values.get("rid", "")
        if store.get(rid) is None:
            raise NotFound(f"response {rid!r} not found (unknown or expired)")
        return rid

    @guarded(responses_error)
    async def retrieve(request: Request):
        return json_response(store.get(stored_or_404(request))["response"])

    @guarded(responses_error)
    async def delete(request: Request):
        rid = stored_or_404(request)
        store.delete(rid)
        return json_response({"id": rid, "object": "response.deleted", "deleted": True})

    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/v1/responses/:rid", retrieve)
    app.router.add_delete("/v1/responses/:rid", delete)
