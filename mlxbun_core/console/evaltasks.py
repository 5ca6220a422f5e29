"""``mlxbun evals run``'s built-in tasks, each scored through the engine ``serve`` runs
(in-process, the same request paths a client reaches over HTTP), data in :mod:`.evalsets`.

- ``mc``: multiple choice by log-likelihood, as lm-eval scores it: each choice's tokens
  (after the question and a space) summed from the prompt's own log-probabilities (a
  completion with ``echo``, ``logprobs`` and ``max_tokens: 0``); ``acc`` picks the highest
  sum, ``acc_norm`` the highest sum per character of the choice.
- ``gen``: greedy, few-shot, up to the end of the line; exact match after trimming spaces,
  a final full stop and case.
- ``json``: chat replies under ``response_format`` ``json_schema``; valid when the text
  parses and satisfies the schema (checked by ``jsonschema``, not by the grammar itself).
- ``tools``: chat with ``tools`` and ``tool_choice: required``; valid when exactly the
  declared tools are called, each with arguments that satisfy its parameters.

Prompts are tokenized with the model's own special tokens (a BOS where its tokenizer adds
one), as the model saw text in training.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from . import evalsets

GEN_MAX_TOKENS = 16
JSON_MAX_TOKENS = 64


@dataclass
class TaskResult:
    """One task's score (``metric`` over ``n`` items) and what each item gave."""

    task: str
    metric: str
    score: float
    n: int
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)  # further metrics (acc_norm)
    items: list[dict[str, Any]] = field(default_factory=list)


async def _run(engine: Any, req: Any) -> tuple[list[Any], Any]:
    """Every event of one request, and its finish (a failed one raises)."""
    from ..events import Done

    gen = await engine.start(req)
    events = [ev async for ev in gen.events()]
    finish = next(ev.finish for ev in events if isinstance(ev, Done))
    if finish.failed:
        raise RuntimeError(f"the request failed: {finish.error}")
    return events, finish


def _encode(engine: Any, text: str) -> list[int]:
    return list(engine.model.tokenizer.encode(text))


async def loglikelihood(engine: Any, context: str, continuation: str) -> tuple[float, int]:
    """The summed log-probability of ``continuation``'s tokens after ``context``, and how
    many there are (lm-eval's split: the whole text's tokens past the context's)."""
    ctx = _encode(engine, context)
    whole = _encode(engine, context + continuation)
    if whole[:len(ctx)] != ctx or len(whole) == len(ctx):  # the boundary merged: lm-eval's
        whole = ctx + list(engine.model.tokenizer.encode(continuation,  # fallback
                                                          add_special_tokens=False))
    req = engine.parse_completion({"prompt": whole, "max_tokens": 0, "echo": True,
                                   "logprobs": 0})
    _, finish = await _run(engine, req)
    entries = finish.prompt_logprobs or []
    scored = entries[len(ctx):]
    return sum(float(e["logprob"]) for e in scored), len(scored)


async def multiple_choice(engine: Any) -> TaskResult:
    right = right_norm = 0
    items = []
    for question, choices, answer in evalsets.MC:
        sums = [(await loglikelihood(engine, question, " " + c))[0] for c in choices]
        best = max(range(len(sums)), key=sums.__getitem__)
        best_norm = max(range(len(sums)), key=lambda i: sums[i] / len(" " + choices[i]))
        right += best == answer
        right_norm += best_norm == answer
        items.append({"loglikelihoods": sums, "pick": best, "answer": answer})
    n = len(evalsets.MC)
    return TaskResult("mc", "acc", right / n, n, extra={"acc_norm": right_norm / n},
                      items=items)


def _normal(text: str) -> str:
    return text.strip().removesuffix(".").strip().casefold()


async def exact_match(engine: Any) -> TaskResult:
    from ..events import Content

    right = 0
    items = []
    for question, answer in evalsets.GEN:
        prompt = f"{evalsets.GEN_SHOTS}Q: {question}\nA:"
        req = engine.parse_completion({"prompt": _encode(engine, prompt), "temperature": 0,
                                       "max_tokens": GEN_MAX_TOKENS, "stop": ["\n"]})
        events, _ = await _run(engine, req)
        text = "".join(ev.text for ev in events if isinstance(ev, Content))
        ok = _normal(text) == _normal(answer)
        right += ok
        items.append({"output": text, "answer": answer, "match": ok})
    return TaskResult("gen", "exact_match", right / len(evalsets.GEN), len(evalsets.GEN),
                      items=items)


def _valid(value: Any, schema: dict[str, Any]) -> bool:
    import jsonschema  # type: ignore[import-untyped]  # no stubs (types-jsonschema is not ours)

    return jsonschema.Draft202012Validator(schema).is_valid(value)


async def json_validity(engine: Any) -> TaskResult:
    from ..events import Content

    valid = 0
    items = []
    for ask, schema in evalsets.JSON:
        req = engine.parse_chat({
            "messages": [{"role": "user", "content": ask}], "temperature": 0,
            "max_tokens": JSON_MAX_TOKENS,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "reply", "schema": schema}}})
        events, _ = await _run(engine, req)
        text = "".join(ev.text for ev in events if isinstance(ev, Content))
        try:
            ok = _valid(json.loads(text), schema)
        except ValueError:
            ok = False
        valid += ok
        items.append({"output": text, "valid": ok})
    return TaskResult("json", "valid", valid / len(evalsets.JSON), len(evalsets.JSON),
                      items=items)


def _call_valid(calls: list[Any], tools: tuple[dict[str, Any], ...]) -> bool:
    params = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    if not calls:
        return False
    for call in calls:
        try:
            args = json.loads(call.arguments)
        except ValueError:
            return False
        if call.name not in params or not _valid(args, params[call.name]):
            return False
    return True


async def tool_call_validity(engine: Any) -> TaskResult:
    from ..events import ToolCallEvent

    valid = 0
    items = []
    for ask, tools in evalsets.TOOLS:
        req = engine.parse_chat({"messages": [{"role": "user", "content": ask}],
                                 "temperature": 0, "max_tokens": JSON_MAX_TOKENS,
                                 "tools": list(tools), "tool_choice": "required"})
        events, _ = await _run(engine, req)
        calls = [ev.call for ev in events if isinstance(ev, ToolCallEvent)]
        ok = _call_valid(calls, tools)
        valid += ok
        items.append({"calls": [{"name": c.name, "arguments": c.arguments} for c in calls],
                      "valid": ok})
    return TaskResult("tools", "valid", valid / len(evalsets.TOOLS), len(evalsets.TOOLS),
                      items=items)


TASKS: dict[str, Callable[[Any], Awaitable[TaskResult]]] = {
    "mc": multiple_choice, "gen": exact_match, "json": json_validity,
    "tools": tool_call_validity}


async def run_task(engine: Any, name: str) -> TaskResult:
    t0 = time.perf_counter()
    result = await TASKS[name](engine)
    result.seconds = time.perf_counter() - t0
    return result
