"""Anthropic's ``cache_control`` breakpoints, found in a Messages body.

A block of ``tools``, ``system`` or a message's ``content`` may carry
``cache_control: {"type": "ephemeral", "ttl": "5m" | "1h"}``: the prompt up to the end
of that block is to be cached (at most four such blocks, as Anthropic allows). The
engine pins each breakpoint's prefix in the prefix cache (``engine/cache_pins.py``).

Where a breakpoint falls among the prompt's tokens is found through the chat template
itself: each breakpoint comes with a variant of the request whose marked block is
followed by a sentinel text (a tool by a sentinel tool in place of those after it). The
engine renders both; the tokens they share are the prefix up to the marked block. This
holds for every template (however it lays out tools, system text and turns), and a
token the block's end merges into is left out, so a pin is always a true prefix of what
the engine prefills.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from ...engine.cache_pins import TTLS
from ...engine.request import CacheBreakpoint, ChatRequest
from ...errors import BadRequest

MAX_BREAKPOINTS = 4
SENTINEL = "⟦mlxbun:breakpoint⟧"
SENTINEL_TOOL = {"name": "mlxbun_breakpoint", "description": SENTINEL,
                 "input_schema": {"type": "object", "properties": {}}}
Path = tuple[str, int, int]  # ("tools" | "system", i, -1) or ("messages", i, j)


def _ttl(mark: object, where: str) -> float:
    if not isinstance(mark, dict) or mark.get("type") != "ephemeral":
        raise BadRequest(f'{where}.cache_control must be {{"type": "ephemeral"}}')
    ttl = mark.get("ttl", "5m")
    if ttl not in TTLS:
        raise BadRequest(f"{where}.cache_control.ttl must be one of {', '.join(TTLS)}")
    return TTLS[ttl]


def _marked(body: dict[str, Any]) -> list[tuple[Path, float]]:
    """Every block carrying ``cache_control``, in prompt order (tools, system, messages)."""
    found: list[tuple[Path, float]] = []
    for field in ("tools", "system"):
        blocks = body.get(field)
        for i, block in enumerate(blocks if isinstance(blocks, list) else []):
            if isinstance(block, dict) and block.get("cache_control") is not None:
                found.append(((field, i, -1), _ttl(block["cache_control"], f"{field}[{i}]")))
    messages = body.get("messages")
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        for j, block in enumerate(content if isinstance(content, list) else []):
            if isinstance(block, dict) and block.get("cache_control") is not None:
                where = f"messages[{i}].content[{j}]"
                found.append((("messages", i, j), _ttl(block["cache_control"], where)))
    if len(found) > MAX_BREAKPOINTS:
        raise BadRequest(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be "
                         f"provided. Found {len(found)}.")
    return found


def _with_sentinel(body: dict[str, Any], path: Path) -> dict[str, Any]:
    """``body`` with the sentinel right after the block at ``path``."""
    out = copy.deepcopy(body)
    field, i, j = path
    if field == "tools":
        out["tools"] = out["tools"][:i + 1] + [dict(SENTINEL_TOOL)]
        return out
    block = out["system"][i] if field == "system" else out["messages"][i]["content"][j]
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        block["text"] += SENTINEL
    elif block.get("type") == "tool_result" and isinstance(block.get("content"), str):
        block["content"] += SENTINEL
    elif block.get("type") == "tool_result" and isinstance(block.get("content"), list):
        block["content"].append({"type": "text", "text": SENTINEL})
    else:  # an image, a tool_use: a text block after it
        out["messages"][i]["content"].insert(j + 1, {"type": "text", "text": SENTINEL})
    return out


def breakpoints(body: dict[str, Any],
                parse: Callable[[dict[str, Any]], ChatRequest]) -> list[CacheBreakpoint]:
    """The body's breakpoints (a fifth is a 400), each with its sentinel variant parsed
    by ``parse`` (the request parser, told to look for no breakpoints)."""
    out = []
    for path, ttl in _marked(body):
        variant = parse(_with_sentinel(body, path))
        out.append(CacheBreakpoint(ttl, variant.messages, variant.tools))
    return out
