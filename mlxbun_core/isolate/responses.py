"""Responses continuation history owned by the isolation parent.

The parent keeps the ``previous_response_id`` store, so an engine crash or an
eviction loses no conversation. For a continued request the parent looks the
history up and hands it to the engine in the body (``HISTORY_FIELD``, honoured
only on the engine's unix socket); when the engine answers, the parent records
the new turn from the finished response (the JSON body, or the stream's
``response.completed`` / ``response.incomplete`` event, as the engine's own store
does). ``GET``/``DELETE /v1/responses/<id>`` answer from this store, engine up or down.
"""

from __future__ import annotations

import contextlib
import json

from ..errors import APIError
from ..server.body import parse_body
from ..server.openai.response_store import ResponseStore
from ..server.openai.responses import HISTORY_FIELD, stored_turn
from ..server.openai.responses_request import conversation
from .drain import send_json


def not_found(message: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


class Turn:
    """One proxied ``POST /v1/responses``: what to store once the engine answers."""

    def __init__(self, store: ResponseStore, body: dict, system: str, convo: list):
        self.store, self.body, self.system, self.convo = store, body, system, convo
        self._buf = bytearray()
        self._sse = False

    def observer(self, resp):
        if resp.status_code != 200 or self.body.get("store", True) is False:
            return None
        self._sse = resp.headers.get("content-type", "").startswith("text/event-stream")
        return self

    def __call__(self, chunk: bytes) -> None:
        self._buf += chunk
        if self._sse:  # keep only unfinished lines; look at completed events
            *lines, rest = bytes(self._buf).split(b"\n")
            self._buf = bytearray(rest)
            for line in lines:
                if line.startswith(b"data:") and (b'"response.completed"' in line
                                                  or b'"response.incomplete"' in line):
                    self._remember(json.loads(line[5:]).get("response"))

    def close(self) -> None:
        if not self._sse and self._buf:
            with contextlib.suppress(ValueError):
                self._remember(json.loads(bytes(self._buf)))

    def _remember(self, response: dict | None) -> None:
        if isinstance(response, dict) and response.get("id"):
            output = response.get("output") or []
            self.store.put(response["id"], {"system": self.system, "response": response,
                                            "messages": stored_turn(self.convo, output)})


class ParentResponses:
    def __init__(self, store: ResponseStore | None = None):
        self.store = store or ResponseStore()

    def prepare(self, raw: bytes):
        """(body to forward, Turn or None, error JSON or None) for a POST /v1/responses.

        Bodies the engine must reject go through untouched, so its error is the answer.
        """
        try:
            body = parse_body(raw)
        except APIError:
            return raw, None, None
        prev = body.get("previous_response_id")
        stored = None
        if isinstance(prev, str):
            stored = self.store.get(prev)
            if stored is None:
                return raw, None, not_found(f"previous response {prev!r} not found "
                                            "(unknown or expired)", "previous_response_id")
        try:
            system, convo = conversation(body, stored)
        except (APIError, TypeError, ValueError, KeyError, AttributeError):
            return raw, None, None
        if stored is not None:
            body[HISTORY_FIELD] = {"system": stored.get("system"),
                                   "messages": stored.get("messages", [])}
            raw = json.dumps(body, ensure_ascii=False).encode()
        return raw, Turn(self.store, body, system, convo), None

    async def answer(self, method: str, rid: str, send) -> None:
        """GET / DELETE /v1/responses/<id> from the parent's store."""
        stored = self.store.get(rid)
        if stored is None:
            return await send_json(send, 404, not_found(f"response {rid!r} not found "
                                                        "(unknown or expired)"))
        if method == "DELETE":
            self.store.delete(rid)
            return await send_json(send, 200, {"id": rid, "object": "response.deleted",
                                               "deleted": True})
        return await send_json(send, 200, stored["response"])
