"""POST /v1/responses (+ GET/DELETE /v1/responses/<id>) — the OpenAI Responses surface.

The body is parsed straight into the engine's typed chat request
(:mod:`.responses_request`, errors named as the client named the fields).
``previous_response_id`` resumes from the app's :class:`~.response_store.ResponseStore`
(``AppState.responses``), which holds each response's conversation in chat form
(instructions carry forward when omitted; reasoning is not replayed). Output items,
the envelope and the event stream live in :mod:`.responses_stream`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response

from ...engine.request import ChatRequest
from ...errors import APIError, BadRequest, NotFound
from ...events import Finish
from .. import generation
from ..common import guarded, json_response, route_param
from .responses_request import check_flags, parse_request
from .responses_stream import (
    ResponseFrames,
    call_item,
    envelope,
    message_item,
    reasoning_item,
    status_of,
)

if TYPE_CHECKING:
    from ...engine.core import Engine
    from ...engine.reply import Reply
    from ..generation import Run
    from ..state import App

# The --isolate parent owns the history and sends it in this body field; honoured only
# by an engine child (``AppState.trusts_injected_history``), ignored everywhere else.
HISTORY_FIELD = "mlxbun_history"


def responses_error(exc: APIError) -> Response:
    # the Responses error type is invalid_request_error or server_error only; a 404
    # keeps its status (the SDKs map it to NotFoundError)
    kind = "server_error" if exc.status >= 500 else "invalid_request_error"
    return json_response({"error": {"message": exc.message, "type": kind,
                                    "param": exc.param, "code": exc.code}}, exc.status)


# ---------------------------------------------------------------- handlers

def stored_turn(convo: list[dict[str, Any]],
                output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation plus this response's output as one chat assistant message."""
    text = "".join(p["text"] for it in output if it["type"] == "message" for p in it["content"])
    calls = [{"id": it["call_id"], "type": "function",
              "function": {"name": it["name"], "arguments": it["arguments"]}}
             for it in output if it["type"] == "function_call"]
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        msg["tool_calls"] = calls
    return convo + [msg]


def register(app: App, engine: Engine) -> None:
    model_id = engine.model.id
    state = app.state
    store = state.responses
    state.stats_providers["response_store"] = store.stats

    def previous(body: dict[str, Any]) -> dict[str, Any] | None:
        injected = body.pop(HISTORY_FIELD, None)
        if isinstance(injected, dict) and state.trusts_injected_history:
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

    def parse(body: dict[str, Any]) -> ChatRequest:
        check_flags(body)
        return parse_request(body, previous(body), engine.defaults, engine.max_tokens)

    def envelope_for(run: Run) -> Callable[..., dict[str, Any]]:
        def make(status: str, output: list[dict[str, Any]], finish: Finish | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
            return envelope(model_id, run.id, run.created, run.body, status, output, finish,
                            error)
        return make

    def remember(run: Run, output: list[dict[str, Any]], response: dict[str, Any]) -> None:
        if run.body.get("store", True) is not False:
            kept = run.request.surface_state
            store.put(run.id, {"system": kept["system"],
                               "messages": stored_turn(kept["convo"], output),
                               "response": response})

    def frames(run: Run) -> ResponseFrames:
        return ResponseFrames(envelope_for(run), lambda output, response: remember(
            run, output, response))

    def answer(run: Run, reply: Reply) -> dict[str, Any]:
        output: list[dict[str, Any]] = [reasoning_item(reply.reasoning)] if reply.reasoning else []
        if not reply.tool_calls or reply.content.strip():
            output.append(message_item(reply.content))
        output += [call_item(c) for c in reply.tool_calls]
        response = envelope_for(run)(status_of(reply.finish), output, reply.finish)
        remember(run, output, response)
        return response

    @guarded(responses_error)
    async def responses(request: Request) -> Response:
        run = await generation.start(request, engine, route="/v1/responses", id_prefix="resp_",
                                     parse=parse)
        return await generation.respond(request, run, frames, answer)

    def stored_or_404(request: Request) -> tuple[str, dict[str, Any]]:
        rid = route_param(request, "rid")
        stored = store.get(rid)
        if stored is None:
            raise NotFound(f"response {rid!r} not found (unknown or expired)")
        return rid, stored

    @guarded(responses_error)
    async def retrieve(request: Request) -> Response:
        return json_response(stored_or_404(request)[1]["response"])

    @guarded(responses_error)
    async def delete(request: Request) -> Response:
        rid, _ = stored_or_404(request)
        store.delete(rid)
        return json_response({"id": rid, "object": "response.deleted", "deleted": True})

    app.router.add_post("/v1/responses", responses)
    app.router.add_get("/v1/responses/:rid", retrieve)
    app.router.add_delete("/v1/responses/:rid", delete)
