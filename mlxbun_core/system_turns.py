"""System messages after the start of a conversation, rendered as the template can.

Clients send system text between turns: Anthropic's ``role: "system"`` messages (Claude
Code's environment note follows the first user turn), OpenAI developer messages. Many
chat templates render a system turn anywhere; others refuse one that is not first
(Qwen3.5's raises) or leave it out without a word. Each template is probed once: when it
shows a system turn in place, the messages go to it unchanged; otherwise every inner
system message is folded into a user turn, the one it directly follows or else the next
one (a user turn of its own at the end when none follows), and a leading run of system
messages becomes one. Folding into the turn it follows keeps earlier turns rendered the
same as the conversation grows, so the prefix cache keeps serving them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

PROBE = "mlxbun-inner-system-probe"
SEPARATOR = "\n\n"
_probed: dict[str, bool] = {}
_lock = threading.Lock()
MAX_PROBED = 64  # distinct templates remembered (a server renders one or two)


def has_inner_system(messages: list[dict]) -> bool:
    """True when a system message follows a message of another role, or another system
    message (a leading run)."""
    return any(m.get("role") == "system" for m in messages[1:])


def renders_inner_system(render: Callable[[list[dict]], str], key: str) -> bool:
    """Whether ``render`` (a template applied to messages) shows a system message placed
    after a user turn and after an assistant turn; remembered per template ``key``."""
    with _lock:
        if key in _probed:
            return _probed[key]
    probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
             {"role": "system", "content": PROBE + "1"}, {"role": "assistant", "content": "a"},
             {"role": "system", "content": PROBE + "2"}, {"role": "user", "content": "v"}]
    try:
        text = render(probe)
        ok = PROBE + "1" in text and PROBE + "2" in text
    except Exception:  # jinja2 raises many types; a refusal is an answer
        ok = False
    with _lock:
        if len(_probed) >= MAX_PROBED:
            _probed.clear()
        _probed[key] = ok
    return ok


def for_template(messages: list[dict], render: Callable[[list[dict]], str], key: str) -> list[dict]:
    """``messages`` as the template can take them (see the module docstring)."""
    if not has_inner_system(messages) or renders_inner_system(render, key):
        return messages
    return fold(messages)


def fold(messages: list[dict]) -> list[dict]:
    """Inner system messages folded into user turns; a leading run merged into one."""
    out: list[dict] = []
    pending: list[dict] = []  # system messages waiting for the next user turn
    for m in messages:
        role = m.get("role")
        if role != "system":
            if role == "user" and pending:
                m = _joined(pending + [m], "user")
                pending = []
            out.append(m)
        elif not out or out[-1].get("role") == "system":  # the leading run
            out[-1:] = [_joined(out[-1:] + [m], "system")]
        elif out[-1].get("role") == "user":
            out[-1] = _joined([out[-1], m], "user")
        else:
            pending.append(m)
    if pending:
        out.append(_joined(pending, "user"))
    return out


def _joined(messages: list[dict], role: str) -> dict:
    """One message of ``role`` holding the contents of ``messages`` in order, with the
    other fields of the first message of that role."""
    contents = [m.get("content") or "" for m in messages]
    content: str | list[dict[str, Any]]
    if all(isinstance(c, str) for c in contents):
        content = SEPARATOR.join(c for c in contents if c)
    else:
        joined: list[dict[str, Any]] = []
        for c in contents:
            parts = [{"type": "text", "text": c}] if isinstance(c, str) else list(c)
            if joined and parts:
                joined.append({"type": "text", "text": SEPARATOR})
            joined += parts
        content = joined
    base = next((m for m in messages if m.get("role") == role), messages[-1])
    return {**base, "role": role, "content": content}
