"""The app-aware assistant: three tools that read, navigate and highlight the web app.

The browser pushes a structured snapshot of what is on screen (a ``context`` frame on
every route change); the model reads it with ``get_current_app_context`` and acts with
``navigate_app`` / ``spotlight_ui``, which become ``ui_navigate`` / ``ui_spotlight``
frames. Nothing here touches the machine, so these tools need no approval.
"""

from __future__ import annotations

import json
from typing import Any

from . import memory

# The SPA's hash routes: the only places navigate_app may send the user.
ROUTES = {"chat": "Chat", "status": "Status", "models": "Models", "quantize": "Quantize",
          "finetune": "Fine-tune", "dataset": "Dataset", "memory": "Memory"}
MAX_ELEMENTS = 120
MAX_FIELD_CHARS = 200
SPOTLIGHT_FIELDS = ("ref", "label", "selector", "target")


def _function(name: str, description: str, properties: dict, required=()) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(required)}}}


TOOLS = [
    _function("get_current_app_context",
              "What the user sees in the web app now: the route and its visible controls.", {}),
    _function("navigate_app", "Open a page of the web app for the user.",
              {"route": {"type": "string", "enum": sorted(ROUTES)}}, ["route"]),
    _function("spotlight_ui", "Briefly highlight a control on the user's screen.",
              {"ref": {"type": "string"}, "label": {"type": "string"},
               "selector": {"type": "string"}, "target": {"type": "string"},
               "route": {"type": "string"}, "message": {"type": "string"}}),
]
TOOL_NAMES = frozenset(t["function"]["name"] for t in TOOLS)
AGENT_TOOLS = TOOLS + memory.TOOLS  # what a turn offers: these and the memory vault's search


class ToolFailed(Exception):
    """A tool call the assistant got wrong: reported back to it as the tool's result."""


def _text(value, limit: int = MAX_FIELD_CHARS) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def clean_context(raw) -> dict | None:
    """The browser's context frame, capped: a route, an optional view/step, ≤120 elements."""
    if not isinstance(raw, dict) or not _text(raw.get("route")):
        return None
    out: dict[str, Any] = {"route": _text(raw["route"], 40)}
    if _text(raw.get("view")):
        out["view"] = _text(raw["view"])
    step = raw.get("step")
    if (isinstance(step, dict) and isinstance(step.get("index"), int)
            and isinstance(step.get("count"), int)):
        out["step"] = {"index": step["index"], "count": step["count"],
                       "label": _text(step.get("label"))}
    snap = raw.get("snapshot")
    if not isinstance(snap, dict):
        snap = {}
    elements = []
    for el in (snap.get("elements") or [])[:MAX_ELEMENTS]:
        if isinstance(el, dict):
            keys = ("ref", "label", "kind", "role", "selector", "spotlightId")
            row = {k: _text(el.get(k)) for k in keys}
            elements.append({k: v for k, v in row.items() if v is not None})
    out["snapshot"] = {"route": out["route"], "elements": elements}
    return out


def ambient_line(context: dict | None) -> str | None:
    """One compact line for the system prompt, e.g. ``[user is on: Status]``."""
    if not context:
        return None
    where = ROUTES.get(context["route"], context["route"])
    step = context.get("step")
    if step:
        where += f" · step {step['index'] + 1}/{step['count']}"
    return f"[user is on: {where}]"


def parse_arguments(arguments) -> dict:
    if isinstance(arguments, dict):
        return arguments
    try:
        args = json.loads(arguments or "{}")
    except (TypeError, ValueError) as exc:
        raise ToolFailed("arguments are not valid JSON") from exc
    if not isinstance(args, dict):
        raise ToolFailed("arguments must be a JSON object")
    return args


def run_tool(name: str, args: dict, context: dict | None) -> tuple[object, dict | None]:
    """Run one app tool: ``(result for the model, frame for the browser or None)``."""
    if name == "get_current_app_context":
        return (context or {"route": None, "note": "the page has not reported its context"}), None
    if name == "navigate_app":
        route = args.get("route") or args.get("page")
        if route not in ROUTES:
            raise ToolFailed(f"unknown route {route!r}; known routes: {', '.join(sorted(ROUTES))}")
        return {"navigated": route}, {"type": "ui_navigate", "route": route}
    if name == "spotlight_ui":
        frame = {k: _text(args.get(k)) for k in (*SPOTLIGHT_FIELDS, "route", "message")}
        frame = {k: v for k, v in frame.items() if v is not None}
        if not any(k in frame for k in SPOTLIGHT_FIELDS):
            raise ToolFailed("spotlight_ui needs one of ref, label, selector or target")
        if "route" in frame and frame["route"] not in ROUTES:
            raise ToolFailed(f"unknown route {frame['route']!r}")
        return {"highlighted": True}, {"type": "ui_spotlight", **frame}
    if name in memory.TOOL_NAMES:
        try:
            return memory.run_tool(name, args), None
        except ValueError as exc:
            raise ToolFailed(str(exc)) from exc
    raise ToolFailed(f"unknown tool {name!r}")
