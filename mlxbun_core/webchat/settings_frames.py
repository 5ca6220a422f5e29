"""Client frames that change how the next turns run: thinking, the system prompt, the
adapter, sampling (for the session or the next turn only), the session's drawn HLG curve,
and the page's context that the app tools read. Each answers with the settings as they
now stand."""

from __future__ import annotations

from typing import Any

from ..engine.hlg import parse_points
from ..engine.sampling import SamplingParams, max_tokens_from
from ..errors import BadRequest
from . import apptools
from .conversation import Conversation
from .fields import text_arg
from .frames import SAMPLING_KEYS
from .overflow import check_policy

MAX_CURVE_NAME = 60


class SettingsFrames:
    """``set_thinking``, ``set_system_prompt``, ``set_adapter``, ``set_sampling``,
    ``set_overflow``, ``set_curve``, ``context``."""

    def __init__(self, conversation: Conversation):
        self.conv = conversation

    async def on_set_thinking(self, frame: dict) -> None:
        enabled = frame.get("enabled")
        if enabled is not None and not isinstance(enabled, bool):
            raise BadRequest("enabled must be true, false or null")
        self.conv.update_settings({"thinking": enabled})
        await self.conv.send_settings()

    async def on_set_system_prompt(self, frame: dict) -> None:
        text = frame.get("text")
        if text is not None:
            text = text_arg(frame)
        self.conv.update_settings({"systemPrompt": text or None})
        await self.conv.send_settings()

    async def on_set_adapter(self, frame: dict) -> None:
        adapter = frame.get("id")
        if adapter is not None and not isinstance(adapter, str):
            raise BadRequest("id must be an adapter id or null")
        self.conv.update_settings({"adapter": adapter or None})
        await self.conv.send_settings()

    async def on_set_sampling(self, frame: dict) -> None:
        conv = self.conv
        scope = frame.get("scope") or "session"
        if scope not in ("session", "next_turn"):
            raise BadRequest("scope must be 'session' or 'next_turn'")
        changes = {k: frame[k] for k in SAMPLING_KEYS if k in frame}
        base = conv.next_turn if scope == "next_turn" else conv.settings.get("sampling")
        current = dict(base or {})
        current.update(changes)
        current = {k: v for k, v in current.items() if v is not None}  # null: server default
        # a bad value is a 400 now, not at the next turn
        SamplingParams.from_body(current, surface="webchat")
        max_tokens_from(current, None)
        if scope == "next_turn":
            conv.next_turn = current
        else:
            conv.update_settings({"sampling": current})
        await conv.send_settings()

    async def on_set_overflow(self, frame: dict) -> None:
        """What a chat that outgrows the window does: ``truncate`` or ``stop``."""
        self.conv.update_settings({"overflow": check_policy(frame.get("policy"))})
        await self.conv.send_settings()

    async def on_set_curve(self, frame: dict) -> None:
        """The session's drawn curve (sent as ``hlg.points`` with each turn), or null for
        none. A curve that goes down is refused here, before any turn, with the engine's
        own message."""
        self.conv.update_settings({"curve": session_curve(frame.get("curve"))})
        await self.conv.send_settings()

    async def on_context(self, frame: dict) -> None:
        self.conv.app_context = apptools.clean_context(frame.get("context"))


def session_curve(value: Any) -> dict | None:
    """``{name, points}`` checked (points monotone, as ``hlg.points`` must be), or None."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest("curve must be an object {name, points} or null")
    name = value.get("name") or "drawn curve"
    if not isinstance(name, str) or len(name) > MAX_CURVE_NAME:
        raise BadRequest(f"curve.name must be a string of at most {MAX_CURVE_NAME} characters")
    points = parse_points(value.get("points"), "curve.points")
    return {"name": name.strip() or "drawn curve", "points": [list(p) for p in points]}
