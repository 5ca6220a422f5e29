"""HEAD on every GET route: the GET's status and headers, no body (HTTP's rule for HEAD).

Clients probe with it (Claude Code sends ``HEAD /`` before it starts); BlackSheep routes
by exact method, so without this a HEAD got a 405. The request runs as the GET it stands
for; once the response has started, its end is sent at once and the rest of the body
dropped, and the app then reads a disconnect, so a streaming GET stops rather than runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from .access_log import HEAD_MARK

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Message, Receive, Send], Awaitable[None]]


def is_head(scope: Message) -> bool:
    return scope.get("type") == "http" and scope.get("method") == "HEAD"


async def as_get(app: ASGIApp, scope: Message, receive: Receive, send: Send) -> None:
    """Run ``app`` on a HEAD request as its GET, sending only the response's start."""
    done = False

    async def head_send(message: Message) -> None:
        nonlocal done
        if done or message.get("type") != "http.response.start":
            return
        await send(message)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        done = True

    async def head_receive() -> Message:
        if done:
            return {"type": "http.disconnect"}
        return await receive()

    await app({**scope, "method": "GET", HEAD_MARK: True}, head_receive, head_send)
