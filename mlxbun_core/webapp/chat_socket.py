"""WS /ws/chat: the web chat's session protocol, carried over a WebSocket.

JSON frames with a ``type`` both ways; :class:`~mlxbun_core.webchat.agent.ChatAgent`
does the work, this module only moves frames. A plain ``GET /ws/chat`` (no upgrade)
is a 426. A server that cannot host the chat calls :func:`refuse` with a reason (the
web app's ``chat_unavailable``): the route then answers 501 (the ``--isolate`` parent,
which is no BlackSheep app, answers 501 itself). ``GET /v1`` carries :func:`availability`
as its ``web_chat`` field, which the page reads before it opens a socket.

Like the other routes that touch files, the chat answers loopback clients only
unless an API key is configured (the guard middleware sees the handshake; browsers
send the key as ``?api_key=``). The chat's coding tools go further: loopback clients only,
even with the key (the key lets a remote client chat, never run tools on this machine).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from blacksheep import Request, Response
from blacksheep.server.websocket import WebSocket, WebSocketDisconnectError

from ..server import guard
from ..server.common import json_response
from ..server.served_model import model_row
from ..webchat.agent import ChatAgent
from ..webchat.mcp.hub import McpHub
from . import state as webapp_state

if TYPE_CHECKING:
    from ..engine.core import Engine
    from ..server.state import App

log = logging.getLogger("mlxbun.webchat")

PATH = "/ws/chat"
ISOLATED = "web chat needs a non-isolated server (it is not available under --isolate)"


def refuse(app: App, reason: str = ISOLATED) -> None:
    """Make /ws/chat answer 501 with ``reason`` (a server that cannot host the chat)."""
    webapp_state.of(app).chat_unavailable = reason


def availability(app: App, request: Request) -> dict[str, Any]:
    """Whether ``request``'s client may chat here, for ``GET /v1``'s ``web_chat`` field (the
    page asks before it opens a socket that would only be refused)."""
    reason = webapp_state.of(app).chat_unavailable
    keyed = app.state.guard.api_key is not None
    if not reason and not keyed and not guard.is_loopback(request):
        reason = guard.LOOPBACK_ONLY
    return {"available": not reason, "reason": reason or None}


def _unavailable(app: App) -> Response | None:
    reason = webapp_state.of(app).chat_unavailable
    if reason:
        return json_response({"error": {"message": reason, "type": "not_implemented"}}, 501)
    return None


def ready_frame(engine: Engine) -> dict[str, Any]:
    row = model_row(engine)
    return {"model": row["id"], "vision": bool(row.get("vision")), "audio": bool(row.get("audio")),
            "thinking": bool(engine.model.reasoning), "genDefaults": row.get("gen_defaults") or {},
            "contextWindow": engine.model.context_window}


class Outbox:
    """Serializes sends; after the client leaves, frames are dropped quietly."""

    def __init__(self, ws: WebSocket):
        self.ws, self.lock, self.open = ws, asyncio.Lock(), True

    async def __call__(self, frame: dict[str, Any]) -> None:
        if not self.open:
            return
        async with self.lock:
            try:
                text = json.dumps(frame, ensure_ascii=False, separators=(",", ":"))
                await self.ws.send_text(text)
            except Exception:  # closed under us: the receive loop ends the session
                self.open = False


async def serve_connection(ws: WebSocket, agent: ChatAgent, outbox: Outbox) -> None:
    await agent.hello()
    try:
        while True:
            # an ASGI message: "text" (str) or "bytes"; BlackSheep annotates both as one AnyStr
            msg: Mapping[str, object] = await ws.receive()
            text, data = msg.get("text"), msg.get("bytes")
            raw = text if isinstance(text, str) else ""
            if text is None and isinstance(data, bytes):
                raw = data.decode("utf-8", "replace")
            try:
                frame = json.loads(raw)
            except ValueError:
                await outbox({"type": "error", "message": "frames must be JSON objects",
                              "status": 400})
                continue
            await agent.handle(frame)
    except WebSocketDisconnectError:
        pass
    finally:
        outbox.open = False
        await agent.close()


def register(app: App, engine: Engine) -> None:
    shared = webapp_state.of(app)
    store = shared.sessions  # PATH is an admin route (guard.ADMIN_PREFIXES)
    app.state.index_providers["web_chat"] = lambda request: availability(app, request)
    hubs: list[McpHub] = []  # mlxbun.yaml's MCP servers: one hub for every connection

    def mcp_hub() -> McpHub:
        if not hubs:
            hubs.append(McpHub(shared.mcp_servers.values()))
        return hubs[0]

    async def stop_mcp(application: object) -> None:
        if hubs:
            await hubs[0].close()

    app.on_stop += stop_mcp

    async def upgrade_required(request: Request) -> Response:
        refusal = _unavailable(app)
        if refusal is not None:
            return refusal
        resp = json_response({"error": {"message": "/ws/chat is a WebSocket: send an upgrade "
                                        "request", "type": "upgrade_required"}}, 426)
        resp.add_header(b"Upgrade", b"websocket")
        return resp

    async def chat(ws: WebSocket) -> None:  # the guard has checked the key and the client
        refusal = _unavailable(app)
        if refusal is not None:
            await guard.deny_websocket(ws, refusal)
            return
        await ws.accept()
        outbox = Outbox(ws)
        # coding tools: loopback clients only, even with the key (guard.py checked the key)
        coding = guard.is_loopback_client(ws.scope.get("client"))
        agent = ChatAgent(engine, store, outbox, ready_frame(engine), coding_allowed=coding,
                          mcp_hub=mcp_hub())
        await serve_connection(ws, agent, outbox)

    app.router.add_get(PATH, upgrade_required)
    app.router.add_ws(PATH, chat)
