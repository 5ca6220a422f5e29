"""The system side of an Anthropic request: the top-level ``system``, ``role: "system"``
messages inside ``messages``, and the thinking / effort controls.

System messages may sit anywhere in ``messages`` (Claude Code puts its environment
note after the first user turn). They become chat ``system`` messages at their own
position; whether a template can show a system turn there, or the text is folded into
a user turn, is decided when the prompt is rendered (:mod:`mlxbun_core.system_turns`).

Some clients lead the system prompt with text that means nothing to the model and
changes often: Claude Code's ``x-anthropic-billing-header: cc_version=…; cc_entrypoint=…;``
block (its version carries a hash of the conversation's first prompt). Left in, it sits in
front of every cached prefix: no two conversations would share the system prompt and tools.
Such blocks are dropped unless ``MLXBUN_KEEP_VOLATILE_SYSTEM=1`` (``mlxbun serve
--keep-volatile-system``).
"""

from __future__ import annotations

from typing import Any

from ...errors import BadRequest
from ...runconfig import current

# system text blocks (or leading lines) that carry per-client metadata, never instructions
VOLATILE_PREFIXES = ("x-anthropic-billing-header:",)
THINKING_TYPES = ("enabled", "disabled", "adaptive", "between_tools")
# blocks a system message may carry besides text: mid-conversation tool changes. Every
# tool in ``tools`` is offered for the whole conversation here, so they change nothing.
TOOL_CHANGE_BLOCKS = ("tool_addition", "tool_removal")


def normalizing() -> bool:
    """Whether volatile system text is dropped (the run configuration's switch, read per
    request)."""
    return not current().server.keep_volatile_system


def _volatile(text: str) -> bool:
    return text.lstrip().startswith(VOLATILE_PREFIXES)


def _text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string")
    return value


def system_prompt(content: object) -> str:
    """The top-level ``system``: a string or a list of text blocks, joined as sent,
    without volatile metadata (a leading line of a string, a whole block of a list)."""
    normalize = normalizing()
    if isinstance(content, str):
        first, _, rest = content.partition("\n")
        return rest if normalize and _volatile(first) else content
    if not isinstance(content, list):
        raise BadRequest("system must be a string or a list of text blocks")
    texts: list[str] = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise BadRequest(f"system[{i}] must be a text block ({{\"type\": \"text\", ...}})")
        text = _text(block.get("text"), f"system[{i}].text")
        if not (normalize and _volatile(text)):
            texts.append(text)
    return "".join(texts)


def _effort(config: object, where: str) -> str | None:
    """``output_config.effort`` as our ``reasoning_effort`` (Anthropic's "max" is our "xhigh")."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise BadRequest(f"{where} must be an object")
    effort = config.get("effort")
    if effort is None:
        return None
    if not isinstance(effort, str) or not effort:
        raise BadRequest(f"{where}.effort must be a non-empty string")
    return {"max": "xhigh"}.get(effort, effort)


def system_message(m: dict[str, Any], i: int,
                   later_user: bool) -> tuple[dict[str, Any] | None, str | None]:
    """``messages[i]`` with role system: the chat message it renders as (None when it
    shows nothing) and the effort it sets for the turn it belongs to."""
    where = f"messages[{i}]"
    clear_at = m.get("clear_at")
    if clear_at not in (None, "never", "next_user_message"):
        raise BadRequest(f"{where}.clear_at must be one of never, next_user_message")
    effort = _effort(m.get("output_config"), f"{where}.output_config")
    content = m.get("content")
    if content is None and m.get("output_config") is None:
        raise BadRequest(f"{where}: a system message needs content or output_config")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[str] = []
        for j, block in enumerate(content):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(_text(block.get("text"), f"{where}.content[{j}].text"))
            elif kind not in TOOL_CHANGE_BLOCKS:
                raise BadRequest(f"{where}.content[{j}]: a system message holds text, "
                                 f"tool_addition and tool_removal blocks, not {kind!r}")
        text = "".join(texts)
    else:
        raise BadRequest(f"{where}.content must be a string or a list of text blocks")
    if clear_at == "next_user_message" and later_user:
        return None, effort  # shown only until the next user turn
    return ({"role": "system", "content": text} if text else None), effort


def thinking_kwargs(kwargs: object, thinking: object) -> object:
    """``chat_template_kwargs`` (as sent) with ``thinking`` as the template switch:
    enabled / between_tools turn thinking on, disabled off; adaptive leaves it to
    ``output_config.effort`` or the model's default. An explicit
    ``chat_template_kwargs.enable_thinking`` wins."""
    if thinking is None:
        return kwargs
    if not isinstance(thinking, dict):
        raise BadRequest("thinking must be an object")
    kind = thinking.get("type")
    if kind not in THINKING_TYPES:
        raise BadRequest("thinking.type must be one of " + ", ".join(THINKING_TYPES))
    if thinking.get("display") not in (None, "summarized", "omitted"):
        raise BadRequest("thinking.display must be one of summarized, omitted")
    if kind == "adaptive":
        return kwargs
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs must be an object")
    return {"enable_thinking": kind != "disabled", **kwargs}


def thinking_omitted(body: dict[str, Any]) -> bool:
    """``thinking.display: "omitted"``: thinking blocks come back without their text."""
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("display") == "omitted"


def top_effort(body: dict[str, Any]) -> str | None:
    return _effort(body.get("output_config"), "output_config")
