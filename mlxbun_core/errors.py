"""Errors that carry an HTTP status; surfaces render them in their own shape."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    status = 500
    type = "server_error"

    def __init__(self, message: str, *, status: int | None = None, type: str | None = None,
                 code: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if type is not None:
            self.type = type
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        err = {"message": self.message, "type": self.type}
        if self.code is not None:
            err["code"] = self.code
        if self.param is not None:
            err["param"] = self.param
        return {"error": err}


class BadRequest(APIError):
    status = 400
    type = "invalid_request_error"


class NotFound(APIError):
    status = 404
    type = "not_found_error"


class QueueFull(APIError):
    status = 429
    type = "resource_admission"

    def __init__(self, message: str = "queue full") -> None:
        super().__init__(message, code="queue_full")


class Unavailable(APIError):
    """The server is draining for shutdown (SIGINT/SIGTERM): try another one or later."""

    status = 503
    type = "unavailable_error"

    def __init__(self,
                 message: str = "server is shutting down: not accepting new requests") -> None:
        super().__init__(message, code="shutting_down")
