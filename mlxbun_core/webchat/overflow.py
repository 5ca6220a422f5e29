"""A chat that outgrows the model's window keeps working.

Before a turn starts, its messages are measured as the engine would render them. When they
leave too little room for an answer, the session's overflow policy decides: ``truncate``
(the default) leaves out the oldest turns, whole (a user message and every answer and tool
result after it), never the system prompt (added from the settings, not the history) nor
the last user message; ``stop`` refuses the turn with a clear error that says what to do.
The context frame warns from :data:`WARN_PERCENT` of that room on, before either happens.
"""

from __future__ import annotations

from typing import Any

from ..errors import BadRequest

POLICIES = ("truncate", "stop")
DEFAULT_POLICY = "truncate"
WARN_PERCENT = 80.0
ANSWER_SHARE = 4  # without a max_tokens setting, a quarter of the window is kept for the answer
ANSWER_CAP = 1024


def policy_of(settings: dict) -> str:
    policy = settings.get("overflow")
    return policy if policy in POLICIES else DEFAULT_POLICY


def check_policy(value: object) -> str:
    if value not in POLICIES:
        raise BadRequest(f"policy must be one of {', '.join(POLICIES)} (got {value!r})")
    return str(value)


def window(engine: Any) -> int | None:
    """The context the engine admits: the model's window, or less under a memory budget."""
    admission = getattr(engine, "admission", None)
    if admission is not None:
        return int(admission.enforced_context)
    limit = engine.model.context_window
    return int(limit) if limit else None


def answer_room(limit: int, body: dict) -> int:
    """Tokens kept free for the answer: the chat's max_tokens, else a share of the window."""
    wanted = body.get("max_tokens")
    if isinstance(wanted, int) and wanted > 0:
        return min(wanted, limit // 2)
    return min(limit // ANSWER_SHARE, ANSWER_CAP)


def warning(tokens: int, limit: int | None, settings: dict) -> str | None:
    """What the context frame says when the chat nears the part of the window a prompt may
    fill (the window less the answer's room); None while far from it."""
    if not limit:
        return None
    budget = limit - answer_room(limit, settings.get("sampling") or {})
    if 100.0 * tokens / max(budget, 1) < WARN_PERCENT:
        return None
    policy = policy_of(settings)
    if policy == "stop":
        return ("The chat is close to the model's context window: once it is full, new "
                "messages are refused (overflow policy: stop).")
    return ("The chat is close to the model's context window: from then on the oldest turns "
            "are left out of what the model reads (overflow policy: drop oldest).")


def turns(messages: list[dict]) -> list[list[dict]]:
    """``messages`` cut before each user message: one group per turn."""
    groups: list[list[dict]] = []
    for m in messages:
        if m.get("role") == "user" or not groups:
            groups.append([])
        groups[-1].append(m)
    return groups


async def fit(conv: Any, messages: list[dict]) -> tuple[list[dict], int]:
    """``messages`` as the next turn may send them, and how many were left out. Raises the
    ``stop`` policy's 400 when they do not fit."""
    engine = conv.engine
    limit = window(engine)
    if not limit:
        return messages, 0
    budget = max(1, limit - answer_room(limit, conv.request_body(messages)))

    async def count(msgs: list[dict]) -> int:
        req = engine.parse_chat(conv.request_body(msgs))
        return int(await engine.count_prompt_tokens(req))

    total = await count(messages)
    if total <= budget:
        return messages, 0
    if policy_of(conv.settings) == "stop":
        raise BadRequest(
            f"this chat is {total} tokens long and the model reads at most {limit} (keeping "
            f"{limit - budget} for the answer); the overflow policy is 'stop': start a new "
            "chat, or choose 'drop oldest turns' in the chat settings",
            code="context_overflow")
    groups = turns(messages)
    lo, hi, best = 1, len(groups) - 1, len(groups) - 1  # drop 1..n-1 turns, keep the last
    if hi < 1:
        return messages, 0  # the last message alone is too long: the engine says so
    while lo <= hi:  # the fewest turns to leave out (fewer left out: longer, monotone)
        mid = (lo + hi) // 2
        if await count([m for g in groups[mid:] for m in g]) <= budget:
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    kept = [m for g in groups[best:] for m in g]
    return kept, len(messages) - len(kept)
