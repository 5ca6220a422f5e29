"""Which models an ``--isolate`` parent serves and under what names: the config file's
aliases (resolved before routing) and the allow-list (``--allow-model``: everything else
gets a 404 in the surface's own error shape, before any engine starts)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..config.duration import parse_keep_alive
from ..errors import APIError
from ..library.downloads import downloading
from ..server.body import parse_body
from .pool import EnginePool, ModelSpec


@dataclass(frozen=True)
class PoolPolicy:
    aliases: dict[str, str] = field(default_factory=dict)
    allowed: frozenset[str] | None = None  # model ids, aliases resolved (None: any)

    def resolve(self, name: str) -> str:
        return self.aliases.get(name, name)

    def allows(self, name: str) -> bool:
        return self.allowed is None or name in self.allowed or self.resolve(name) in self.allowed


@dataclass(frozen=True)
class Routing:
    """What the parent reads from a generation body before it picks an engine."""

    model: object = None  # the body's model field, an alias resolved
    keep_alive: float | None = None  # seconds (math.inf: forever); None: not sent
    error: str | None = None  # a bad keep_alive, said for a 400


def form_fields(body: bytes) -> dict[str, str]:
    """The text parts of a multipart form (``/v1/audio/transcriptions``), the audio left
    out; an unreadable form has none (the engine's own parser says what is wrong)."""
    from blacksheep.multipart import parse_multipart

    fields: dict[str, str] = {}
    try:
        for part in parse_multipart(body):
            if part.file_name is None and part.name != b"file":
                fields[part.name.decode("utf-8", "replace")] = part.data.decode(
                    "utf-8", "replace")
    except Exception:  # the parser's errors are not typed
        return {}
    return fields


def routing_fields(body: bytes, policy: PoolPolicy, content_type: bytes | None = None) -> Routing:
    """``model`` (aliases resolved) and ``keep_alive`` of a body, JSON or a multipart form;
    a malformed body routes to the default engine, whose own parser says what is wrong."""
    fields: dict
    if content_type and content_type.lower().startswith(b"multipart/form-data"):
        fields = form_fields(body)
    else:
        try:
            fields = parse_body(body)
        except APIError:
            return Routing()
    model = fields.get("model")
    if isinstance(model, str):
        model = policy.resolve(model)
    raw = fields.get("keep_alive")
    if raw is None:
        return Routing(model)
    try:
        return Routing(model, parse_keep_alive(raw))
    except ValueError as exc:
        return Routing(model, error=str(exc))


def refusal(path: str, status: int, message: str, param: str = "model") -> dict:
    """An error body in the shape of the surface at ``path`` (Anthropic or OpenAI)."""
    if path.startswith("/v1/messages"):
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        return {"type": "error", "error": {"type": kind, "message": message}}
    code = "model_not_found" if status == 404 else "invalid_value"
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": code}}


def route(path: str, routing: Routing, pool: EnginePool, policy: PoolPolicy,
          servable: Callable[[str], bool]) -> tuple[ModelSpec, tuple[int, dict] | None]:
    """The engine a generation request goes to, or why it goes nowhere: a 400 for a bad
    keep_alive, a 404 for a model the allow-list leaves out (no engine starts for it) or
    for an allowed model whose files are not here (yet)."""
    if routing.error is not None:
        return pool.default, (400, refusal(path, 400, routing.error, param="keep_alive"))
    name = routing.model
    named = isinstance(name, str) and bool(name)
    if policy.allowed is not None and named and not servable(str(name)):
        return pool.default, (404, refusal(path, 404, (
            f"The model {name!r} is not served here (GET /v1/models lists the models this "
            "server may serve)")))
    spec = pool.target(name)
    default = pool.default_engine()
    served = {pool.default.id, default.model_id if default is not None else pool.default.id}
    if policy.allowed is not None and pool.cap > 1 and named and spec is pool.default \
            and name not in served:
        state = "still downloading" if name in downloading() else "not on disk"
        return spec, (404, refusal(path, 404, (
            f"The model {name!r} is allowed but {state} (GET /v1/models says each "
            "model's state)")))
    return spec, None
