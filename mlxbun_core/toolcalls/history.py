"""Chat history as chat templates read it.

Clients send what the OpenAI wire allows: an assistant turn with ``tool_calls`` and
no ``content`` (or ``null``), arguments as a JSON string, a ``tool`` turn without the
function's name. Templates index ``message['content']`` (SmolLM2's fails on a missing
or null one), iterate ``arguments`` as a mapping, or print a tool result's ``name``.
:func:`normalize_history` gives every template the fields it reads.

Some templates know nothing of tools (SmolLM2's ChatML): :func:`without_tool_support`
then writes the tools into the system turn and earlier calls into the assistant's
text, in the Hermes ``<tool_call>`` form the generic parser reads, so the model sees
what it may call and what it called.
"""

from __future__ import annotations

import json

from ..errors import BadRequest
from .core import repair_json


def normalize_history(messages: list[dict], param: str = "messages") -> list[dict]:
    """Copies of ``messages`` with ``content`` always a string or a part list,
    ``tool_calls`` arguments as mappings, and tool results named after their call.
    Errors name the client's message list ``param``."""
    names: dict[str, str] = {}
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            m["tool_calls"] = [template_call(c, param) for c in _list(m["tool_calls"], param)]
            for c in m["tool_calls"]:
                if isinstance(c.get("id"), str):
                    names[c["id"]] = c["function"]["name"]
        if m.get("content") is None:
            m["content"] = ""
        if m.get("role") == "tool" and not m.get("name"):
            name = names.get(str(m.get("tool_call_id")))
            if name:
                m["name"] = name
        out.append(m)
    return out


def _list(calls, param: str) -> list:
    if not isinstance(calls, list):
        raise BadRequest("tool_calls must be a list", param=param)
    return calls


def template_call(call, param: str = "messages") -> dict:
    """One assistant tool call with its arguments as a mapping (a JSON string that is
    not an object, even repaired, is kept as it is)."""
    if not isinstance(call, dict):
        raise BadRequest("tool_calls entries must be objects", param=param)
    fn = call.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise BadRequest("tool_calls entries need a function object with a name",
                         param=param)
    args = fn.get("arguments")
    if args is None:
        args = {}
    elif isinstance(args, str):
        decoded = repair_json(args) if args.strip() else {}
        args = decoded if isinstance(decoded, dict) else args
    out = dict(call, type=call.get("type") or "function", function=dict(fn, arguments=args))
    return out


# ---------------------------------------------------------------- tool-less templates

TOOLS_PREAMBLE = (
    "You may call these functions (JSON signatures):\n<tools>\n{tools}\n</tools>\n"
    "To call one, reply with:\n<tool_call>\n"
    '{{"name": "function_name", "arguments": {{"argument": "value"}}}}\n</tool_call>')


def supports_tools(template: str | None) -> tuple[bool, bool]:
    """Whether a template renders ``tools`` and assistant ``tool_calls`` itself."""
    if not isinstance(template, str):
        return True, True  # several named templates, or none: leave it alone
    return "tools" in template.replace("tool_calls", ""), "tool_calls" in template


def without_tool_support(messages: list[dict], tools: list | None,
                         template: str | None) -> list[dict]:
    """``messages`` with the tools and earlier calls written as text, for the parts
    ``template`` does not render."""
    renders_tools, renders_calls = supports_tools(template)
    out = messages
    if not renders_calls:
        out = [_calls_as_text(m) if m.get("tool_calls") else m for m in out]
    if tools and not renders_tools:
        listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
        out = with_system_text(out, TOOLS_PREAMBLE.format(tools=listing))
    return out


def _calls_as_text(m: dict) -> dict:
    blocks = []
    for c in m["tool_calls"]:
        fn = c["function"]
        args = fn["arguments"] if isinstance(fn["arguments"], dict) else repair_json(
            str(fn["arguments"])) or {}
        blocks.append("<tool_call>\n" + json.dumps({"name": fn["name"], "arguments": args},
                                                   ensure_ascii=False) + "\n</tool_call>")
    content = m.get("content")
    if not isinstance(content, str):
        content = ""
    text = "\n".join(([content] if content.strip() else []) + blocks)
    m = dict(m, content=text)
    m.pop("tool_calls")
    return m


def with_system_text(messages: list[dict], text: str) -> list[dict]:
    """Templates often allow one leading system turn: extend it or add one."""
    if messages and messages[0].get("role") in ("system", "developer") \
            and isinstance(messages[0].get("content"), str):
        first = dict(messages[0], content=(messages[0]["content"] + "\n\n" + text).strip())
        return [first] + messages[1:]
    return [{"role": "system", "content": text}] + messages
