"""A WebSocket handshake answered with HTTP instead of an upgrade (a refusal), through
the raw ASGI ``send``.

ASGI's ``websocket.http.response`` extension (uvicorn has it) lets the app answer a
handshake with a status and a body. BlackSheep's ``WebSocket`` has no public way to send
such a message, so the app's ASGI entry (:class:`~.state.App`) wraps the ``send`` it is
handed in a :class:`Handshake` and puts it in the WebSocket's scope: the guard answers a
refusal through it (:meth:`Handshake.deny`), and the access log reads what was answered
(:attr:`Handshake.refused`) to write the refusal's line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
Send = Callable[[Message], Awaitable[None]]

SCOPE_KEY = "mlxbun.handshake"
EXTENSION = "websocket.http.response"
CLOSED_EARLY = (403, b"closed before the handshake")
"""A socket closed before it was accepted: the server answers the handshake 403."""


class Handshake:
    """The ASGI ``send`` of one WebSocket, noting how its handshake was answered."""

    def __init__(self, send: Send, scope: Message):
        self.send = send
        extensions = scope.get("extensions")
        self.can_answer = isinstance(extensions, dict) and EXTENSION in extensions
        self.accepted = False
        self.status: int | None = None
        self.refused: tuple[int, bytes] | None = None
        """``(status, body)`` of an HTTP answer to the handshake, once its body went."""

    async def __call__(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "websocket.accept":
            self.accepted = True
        elif kind == "websocket.http.response.start":
            self.status = int(message.get("status", 0))
        elif kind == "websocket.http.response.body" and self.status is not None \
                and self.refused is None:
            self.refused = (self.status, bytes(message.get("body", b"")))
        elif kind == "websocket.close" and self.status is None and not self.accepted \
                and self.refused is None:
            self.refused = CLOSED_EARLY
        await self.send(message)

    async def deny(self, status: int, body: bytes) -> bool:
        """Answer the handshake with ``status`` and a JSON ``body``; False where the
        server lacks the extension (the caller then closes the socket: a 403)."""
        if not self.can_answer:
            return False
        await self({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await self({"type": "websocket.http.response.body", "body": body})
        return True


def wrap(scope: Message, send: Send) -> Send:
    """``send`` as a :class:`Handshake` in the scope of a WebSocket (else as it is)."""
    if scope.get("type") != "websocket":
        return send
    handshake = Handshake(send, scope)
    scope[SCOPE_KEY] = handshake
    return handshake


def of(scope: Mapping[str, object]) -> Handshake | None:
    """The :class:`Handshake` :func:`wrap` put in ``scope`` (None: not a WebSocket, or
    an app whose entry does not wrap)."""
    found = scope.get(SCOPE_KEY)
    return found if isinstance(found, Handshake) else None
