"""Chat-template rendering shared by the generic plugin and family plugins.

Families differ in defaults (thinking on/off, effort mapping); the mechanics of
applying a Jinja template through the tokenizer live here once.
"""

from __future__ import annotations

from . import system_turns
from .errors import BadRequest
from .model import LoadedModel, Prompt
from .toolcalls.history import without_tool_support

REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


def check_reasoning_effort(effort, name: str = "reasoning_effort") -> str | None:
    """A known effort level, or None; the 400 names the field as the client sent it
    (``name``: Anthropic's ``output_config.effort``, Responses' ``reasoning.effort``)."""
    if effort is None:
        return None
    if effort not in REASONING_EFFORTS:
        raise BadRequest(f"{name} must be one of 'none', 'minimal', 'low', "
                         "'medium', 'high', 'xhigh'", param=name)
    return effort


def thinking_switch(template_kwargs: dict, reasoning_effort, default: bool | None) -> bool | None:
    """Whether thinking is on: an explicit ``enable_thinking`` wins, then
    ``reasoning_effort`` ("none" → off, any other level → on), then the family default."""
    effort = check_reasoning_effort(reasoning_effort)  # a bad level is a 400 even when overridden
    if "enable_thinking" in template_kwargs:
        return bool(template_kwargs["enable_thinking"])
    if effort is not None:
        return effort != "none"
    return default


def think_markers(tokenizer) -> tuple[str | None, str | None]:
    if getattr(tokenizer, "has_thinking", False):
        return tokenizer.think_start, tokenizer.think_end
    return None, None


def apply_template(model: LoadedModel, messages: list, tools, template_kwargs: dict,
                   chat_template: str | None = None) -> Prompt:
    """Render with the checkpoint's (or a given) Jinja template and tokenize.

    Template errors (a role the template refuses, a missing field) are the
    client's doing, so they become a 400 ``prompt build failed: …``. System messages
    after the first turn go in place or folded into user turns, as the template can
    (:mod:`.system_turns`).
    """
    tok = model.tokenizer
    kwargs = dict(template_kwargs)
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    template = chat_template if chat_template is not None else getattr(tok, "chat_template", None)
    messages = without_tool_support(messages, tools, template)
    messages = system_turns.for_template(
        messages, lambda probe: tok.apply_chat_template(
            probe, tokenize=False, add_generation_prompt=True, **kwargs),
        key=template if isinstance(template, str) else repr(template))
    try:
        text = tok.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                       add_generation_prompt=True, **kwargs)
    except Exception as exc:  # jinja2 raises many types; all mean "bad prompt"
        raise BadRequest(f"prompt build failed: {exc}") from exc
    tokens = tok.encode(text, add_special_tokens=False)
    start, end = think_markers(tok)
    return Prompt(tokens=tokens, text=text, think_start=start, think_end=end,
                  in_reasoning=opens_thinking(text, start, end))


def opens_thinking(text: str, start: str | None, end: str | None) -> bool:
    """True when the rendered prompt ends inside an open think channel."""
    if not start:
        return False
    tail = text.rstrip()
    pos = tail.rfind(start)
    return pos >= 0 and tail.find(end or "\0", pos) < 0 and len(tail) - pos - len(start) <= 1


def install_fallback_template(tokenizer, text: str) -> bool:
    """Give a tokenizer that ships no chat template the plugin's ``text``.

    ``tokenizer`` is an mlx-lm ``TokenizerWrapper`` (or a bare HF tokenizer). The
    template goes on the HF tokenizer, and the wrapper's ``has_chat_template`` is set,
    so every reader sees it. A non-empty template, or a wrapper-level renderer, counts
    as having one. Returns whether the fallback was installed.
    """
    if getattr(tokenizer, "chat_template", None):
        return False
    if getattr(tokenizer, "has_chat_template", False):  # a wrapper-level renderer
        return False
    tokenizer.chat_template = text  # (the wrapper hands it to its HF tokenizer)
    if hasattr(tokenizer, "has_chat_template"):
        tokenizer.has_chat_template = True
    return True
