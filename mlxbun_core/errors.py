"""Errors that carry an HTTP status; surfaces render them in their own shape."""

from __future__ import annotations

from typing import Any

# on a 503 from an engine whose device failed: the engine is restarting, the request ran
# nothing (an ``--isolate`` parent holds it and sends it to the restarted engine)
RESTARTING_HEADER = "X-Mlxbun-Restarting"


class APIError(Exception):
    status = 500
    type = "server_error"
    retry_after: int | None = None  # seconds: sent as ``Retry-After`` (503s)
    restarting = False  # the engine is restarting: an ``--isolate`` parent sends it again

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

    def headers(self) -> dict[str, str]:
        """The response headers the error comes with (``Retry-After`` on a 503)."""
        out = {}
        if self.retry_after is not None:
            out["Retry-After"] = str(self.retry_after)
        if self.restarting:
            out[RESTARTING_HEADER] = "1"
        return out

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


class Overloaded(APIError):
    """The request cannot run now and ran nothing: not enough memory for it within its
    wait (``memory_pressure``), or the device failed and the engine is restarting
    (``device_fault``). A 503 with ``Retry-After``: a client may send it again then."""

    status = 503
    type = "overloaded_error"

    def __init__(self, message: str, retry_after: int, code: str = "memory_pressure",
                 restarting: bool = False) -> None:
        super().__init__(message, code=code)
        self.retry_after = max(1, int(retry_after))
        self.restarting = restarting


class ExpertsUnsupported(ValueError):
    """``--expert-offload`` / ``--expert-budget`` for a model whose experts cannot be
    streamed (a dense model, a family that loads its own way): start-up refuses it."""
