"""A /ws/chat client for tests: a real WebSocket (the ``websockets`` library) to a real server."""

from __future__ import annotations

import json
import time

from websockets.sync.client import connect


class ChatClient:
    """Send client frames, read server frames; every frame read is kept in ``seen``."""

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float = 60.0):
        url = base_url.replace("http://", "ws://", 1) + "/ws/chat"
        if api_key is not None:
            url += f"?api_key={api_key}"
        self.ws = connect(url, max_size=None, open_timeout=timeout).__enter__()
        self.timeout = timeout
        self.seen: list = []

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.ws.close()

    def send(self, kind: str, **fields) -> None:
        """Send a frame. An ``approval`` echoes its card's ``approvalToken`` (from the
        frames read so far), as the page does, unless the call sets one itself."""
        if kind == "approval" and "approvalToken" not in fields:
            card = next((f for f in reversed(self.seen) if f.get("type") ==
                         "tool_approval_request" and f.get("callId") == fields.get("callId")),
                        None)
            if card is not None:
                fields["approvalToken"] = card.get("approvalToken")
        self.send_frame({"type": kind, **fields})

    def send_frame(self, frame) -> None:
        """Send ``frame`` exactly as given (any JSON value)."""
        self.ws.send(json.dumps(frame))

    def recv(self, timeout: float | None = None) -> dict:
        frame = json.loads(self.ws.recv(timeout=self.timeout if timeout is None else timeout))
        self.seen.append(frame)
        return frame

    def until(self, kind: str, timeout: float | None = None) -> list:
        """Frames up to and including the next one of type ``kind``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out = []
        while True:
            frame = self.recv(max(0.01, deadline - time.monotonic()))
            out.append(frame)
            if frame["type"] == kind:
                return out

    def hello(self) -> dict:
        """Read the greeting (ready, settings, history, sessions, context); the frames by type."""
        return {f["type"]: f for f in self.until("context")}

    def turn(self, kind: str = "prompt", **fields) -> list:
        """Send a turn-starting frame and read through its closing ``history`` frame."""
        self.send(kind, **fields)
        frames = self.until("turn_end")
        return frames + self.until("history")
