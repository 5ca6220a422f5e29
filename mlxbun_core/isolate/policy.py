"""Which models an ``--isolate`` parent serves and under what names: the config file's
aliases (resolved before routing) and the allow-list (``--allow-model``: everything else
gets a 404 in the surface's own error shape, before any engine starts)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config.duration import parse_keep_alive
from ..errors import APIError
from ..server.body import parse_body


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


def routing_fields(body: bytes, policy: PoolPolicy) -> Routing:
    """``model`` (aliases resolved) and ``keep_alive`` of a body; a malformed body routes
    to the default engine, whose own parser says what is wrong."""
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
