"""POST /v1/responses — the OpenAI Responses surface (request side and handlers).

Input items are translated into the OpenAI chat body shape and run through
the engine's chat path like every other surface. ``previous_response_id``
resumes from a per-process :class:`ResponseStore` holding each response's
conversation in chat form (instructions carry forward when omitted; reasoning
is not replayed). Output items, the envelope and the event stream live in
:mod:`.responses_stream`.
"""

from __future__ import annotations

from blacksheep import Request

from ..errors import APIError, BadRequest, NotFound
from . import generation
from .common import guarded, json_response
from .field_names import renamed
from .response_store import ResponseStore
from .responses_stream import (ResponseFrames, call_item, envelope, message_item,
                               reasoning_item, status_of)

# sampler fields and mlx-lm extensions passed through to the chat body as-is
PASSTHROUGH = ("stream", "temperature", "top_p", "top_k", "min_p", "xtc_probability", "xtc_threshold",
               "logit_bias", "repetition_penalty", "repetition_context_size",
               "presence_penalty", "presence_context_size", "frequency_penalty",
               "frequency_context_size", "seed", "stop", "chat_template_kwargs",
               "reasoning_effort", "response_format", "adapter", "parallel_tool_calls",
               "budget_close")
TEXT_PARTS = ("input_text", "output_text", "text")
# The --isolate parent owns the history and sends it in this body field; honoured only
# by an engine child (``app.trusts_injected_history``), ignored everywhere else.
HISTORY_FIELD = "mlxbun_history"


def responses_error(exc: APIError):
    # the Responses error type is invalid_request_error or server_error only; a 404
    # keeps its status (the SDKs map it to NotFoundError)
    kind = "server_error" if exc.status >= 500 else "invalid_request_error"
    return json_response({"error": {"message": exc.message, "type": kind,
                                    "param": exc.param, "code": exc.code}}, exc.status)


# ---------------------------------------------------------------- request side

def _string(value, where: str, param: str = "input") -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string", param=param)
    return value


def _part(part) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in TEXT_PARTS:
        return {"type": "text", "text": _string(part.get("text"), f"{kind} text")}
    if kind == "refusal":
        return {"type": "text", "text": _string(part.get("refusal"), "refusal text")}
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
            name = _string(item.get("name"), "function_call name")
            args = item.get("arguments")
            call = {"id": str(item.get("call_id") or item.get("id") or ""), "type": "function",
                    "function": {"name": name, "arguments": "{}" if args is None else
                                 _string(args, "function_call arguments")}}
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
    for i, t in enumerate(tools):
        if not isinstance(t, dict):
            raise BadRequest(f"tools[{i}] must be an object", param="tools")
        if t.get("type") != "function":
            continue  # built-in tools (web_search, file_search, mcp, …) are not ours
        if isinstance(t.get("function"), dict):
            out.append(t)  # already chat-shaped
            continue
        name, params = t.get("name"), t.get("parameters")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"tools[{i}].name must be a non-empty string", param="tools")
        if params is not None and not isinstance(params, dict):
            raise BadRequest(f"tools[{i}].parameters must be a JSON schema object",
                             param="tools")
        description = t.get("description")
        if description is not None and not isinstance(description, str):
            raise BadRequest(f"tools[{i}].description must be a string", param="tools")
        strict = True if t.get("strict") is None else t["strict"]  # the Responses default
        if not isinstance(strict, bool):
            raise BadRequest(f"tools[{i}].strict must be a boolean", param="tools")
        out.append({"type": "function", "function": {
            "name": name, "description": description or "", "strict": strict,
            "parameters": params or {"type": "object", "properties": {}}}})
    return out or None


def _tool_choice(choice, tools: list | None):
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = _string(choice.get("name"), "tool_choice.name", "tool_choice")
        if name not in {t["function"]["name"] for t in tools or ()}:
            raise BadRequest(f"tool_choice.name: no function tool named {name!r}",
                             param="tool_choice")
        return {"type": "function", "function": {"name": name}}
    raise BadRequest('tool_choice must be "auto", "none", "required" or '
                     '{"type": "function", "name": ...}', param="tool_choice")


def _text_format(body: dict) -> dict | None:
    """``text.format`` as a chat ``response_format`` (None: plain text)."""
    text = body.get("text")
    if text is None:
        return None
    if not isinstance(text, dict):
        raise BadRequest("text must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("text.format must be an object", param="text.format")
    kind = fmt.get("type")
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {
            k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}}
    if kind in ("json_object", "text"):
        return {"type": kind}
    raise BadRequest("text.format.type must be one of 'text', 'json_object', 'json_schema'",
                     param="text.format.type")


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
    if reasoning is not None and not isinstance(reasoning, dict):
        raise BadRequest("reasoning must be an object", param="reasoning")
    if reasoning and reasoning.get("effort") is not None:
        chat.setdefault("reasoning_effort", reasoning["effort"])
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    if tools:
        chat["tools"] = tools
        if choice is not None:
            chat["tool_choice"] = choice
    elif choice == "required":
        raise BadRequest('tool_choice "required" needs function tools', param="tool_choice")
    fmt = _text_format(body)
    if fmt is not None and fmt["type"] != "text":
        chat["response_format"] = fmt
    return chat, system, convo


def chat_names(body: dict) -> dict:
    """Chat body field → the Responses field it came from (for error messages)."""
    names = {"messages": "input"}
    if body.get("max_output_tokens") is not None:
        names["max_tokens"] = "max_output_tokens"
    reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
    if body.get("reasoning_effort") is None and reasoning.get("effort") is not None:
        names["reasoning_effort"] = "reasoning.effort"
    text = body.get("text") if isinstance(body.get("text"), dict) else {}
    fmt = text.get("format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        names.update({"response_format.json_schema": "text.format",
                      "response_format": "text.format"})
    return names


# ---------------------------------------------------------------- handlers

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

    def previous(body) -> dict | None:
        injected = body.pop(HISTORY_FIELD, None)
        if isinstance(injected, dict) and getattr(app, "trusts_injected_history", False):
            return injected
        prev = body.get("previous_response_id")
        if prev is None:
            return None
        if not isinstance(prev, str):
            raise BadRequest("previous_response_id must be a string",
                             param="previous_response_id")
        stored = store.get(prev)
        if stored is None:
            raise NotFound(f"previous response {prev!r} not found (unknown or expired)",
                           param="previous_response_id")
        return stored

    def parse(body: dict):
        for name in ("stream", "store"):
            if body.get(name) is not None and not isinstance(body[name], bool):
                raise BadRequest(f"{name} must be a boolean", param=name)
        chat, system, convo = to_chat(body, previous(body))
        try:
            typed = engine.parse_chat(chat)
        except APIError as exc:
            raise renamed(exc, chat_names(body)) from exc
        typed.surface_state.update(system=system, convo=convo)  # what the store keeps
        return typed

    def envelope_for(run):
        return lambda status, output, finish=None, error=None: envelope(
            model_id, run.id, run.created, run.body, status, output, finish, error)

    def remember(run, output, response):
        if run.body.get("store", True) is not False:
            kept = run.request.surface_state
            store.put(run.id, {"system": kept["system"],
                               "messages": stored_turn(kept["convo"], output),
                               "response": response})

    def frames(run):
        return ResponseFrames(envelope_for(run), lambda output, response: remember(
            run, output, response))

    def answer(run, reply) -> dict:
        output = [reasoning_item(reply.reasoning)] if reply.reasoning else []
        if not reply.tool_calls or reply.content.strip():
            output.append(message_item(reply.content))
        output += [call_item(c) for c in reply.tool_calls]
        response = envelope_for(run)(status_of(reply.finish), output, reply.finish)
        remember(run, output, response)
        return response

    @guarded(responses_error)
    async def responses(request: Request):
        run = await generation.start(request, engine, route="/v1/responses", id_prefix="resp_",
                                     parse=parse)
        return await generation.respond(request, run, frames, answer)

    def stored_or_404(request: Request) -> tuple[str, dict]:
        rid = request.route_values.get("rid", "")
        stored = store.get(rid)
        if stored is None:
            raise NotFound(f"response {rid!r} not found (unknown or expired)")
        return rid, stored

    @guarded(responses_error)
    async def retrieve(request: Request):
        return json_response(stored_or_404(request)[1]["response"])

    @guarded(responses_error)
    async def delete(request: Request):
        rid, _ = stored_or_404(request)
        store.delete(rid)
        return json_response({"id": rid, "object": "response.deleted", "deleted": True})

    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/v1/responses/:rid", retrieve)
    app.router.add_delete("/v1/responses/:rid", delete)
