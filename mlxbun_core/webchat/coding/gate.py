"""One connection's coding tools: the workspace (none: off), the calls that wait for the
user's approval, and how a call runs.

Read-only tools (``read``, ``grep``, ``ls``) run at once. ``edit``, ``write`` and ``bash``
are gated: when a model message asks for them, every gated call is planned and announced
first (``tool_approval_request`` with its diff or command, then ``queue_update`` listing
all that wait), and each then waits for its ``approval`` frame, in the model's order. A
tool the user always allows (the store in :mod:`..approvals`) skips the card.

Each card carries a secret (``approvalToken``) that its answer must echo: only the page
that was shown the card can answer it, never a frame written blind.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import approvals
from ..apptools import ToolFailed, parse_arguments
from . import files, search, shell, shown
from .workspace import Workspace

Send = Callable[[dict], Awaitable[None]]
READ_ONLY = ("read", "grep", "ls")
GATED = ("edit", "write", "bash")
NAMES = frozenset(READ_ONLY + GATED)
LOOPBACK_ONLY = "coding tools answer loopback clients only"
READ_DEADLINE_S = search.DEADLINE_S + 5  # grep stops itself at its deadline; this is the bound


def _fn(name: str, description: str, properties: dict, required: tuple = ()) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": list(required)}}}


_S, _B, _N = {"type": "string"}, {"type": "boolean"}, {"type": "number"}
TOOLS = [
    _fn("read", "Read a text file of the workspace.", {"path": _S}, ("path",)),
    _fn("ls", "List a folder of the workspace (default: its top).", {"path": _S}),
    _fn("grep", "Search the workspace's text files for a regular expression (RE2 syntax: "
        "no lookarounds or backreferences); glob filters the file paths.",
        {"pattern": _S, "path": _S, "glob": _S}, ("pattern",)),
    _fn("edit", "Replace an exact string in a file (once; replace_all for every one). "
        "The user approves the diff first.",
        {"path": _S, "old_string": _S, "new_string": _S, "replace_all": _B},
        ("path", "old_string", "new_string")),
    _fn("write", "Write a whole file (created if absent). The user approves the diff first.",
        {"path": _S, "content": _S}, ("path", "content")),
    _fn("bash", "Run a command with bash -c in the workspace (or cwd, a folder inside it). "
        "The user approves the command first.", {"command": _S, "cwd": _S, "timeout": _N},
        ("command",)),
]


@dataclass
class Waiting:
    """A gated call announced to the user: its plan and the decision it waits for."""

    tool: str
    args: dict
    plan: Any = None  # files.Change for edit/write; (command, cwd, timeout) for bash
    error: str | None = None  # planning failed: the call ends with this, unasked
    token: str = field(default_factory=lambda: secrets.token_urlsafe(18))  # the card's secret
    decision: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop()
                                     .create_future())


class CodingSession:
    """Whether coding tools are on (and where), for one connection; ``allowed`` is False
    for a client that may never have them (not loopback)."""

    def __init__(self, send: Send, allowed: bool = False, home: Path | None = None):
        self.send, self.allowed, self.home = send, allowed, home
        self.workspace: Workspace | None = None
        self.waiting: dict[str, Waiting] = {}
        self.command: asyncio.Task | None = None

    # -- state ---------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self.workspace is not None

    def tools(self) -> list[dict]:
        return TOOLS if self.active else []

    def system_line(self) -> str | None:
        if self.workspace is None:
            return None
        return (f"[coding tools on: workspace {self.workspace.root}; paths are relative to "
                "it; edit, write and bash wait for the user's approval]")

    def handles(self, name: str) -> bool:
        return name in NAMES

    async def send_state(self) -> None:
        await self.send({"type": "coding_tools", "active": self.active,
                         "workspace": str(self.workspace.root) if self.workspace else None,
                         "pending": self._pending(), "available": self.allowed,
                         "gated": list(GATED)})

    async def send_approvals(self) -> None:
        await self.send({"type": "tool_approvals", "alwaysAllow": approvals.approvals(self.home)})

    def _pending(self) -> list[str]:
        """The calls whose card waits for an answer, in the model's order."""
        return [k for k, w in self.waiting.items() if w.error is None and not w.decision.done()]

    async def send_queue(self) -> None:
        pending = [{"callId": k, "tool": self.waiting[k].tool} for k in self._pending()]
        await self.send({"type": "queue_update", "steering": [], "followUp": [],
                         "approvals": pending})

    def stop(self, reason: str) -> None:
        """Deny every waiting call and kill a running command (an abort, coding off)."""
        for w in self.waiting.values():
            if not w.decision.done():
                w.decision.set_result({"decision": "deny", "reason": reason})
        if self.command is not None:
            self.command.cancel()

    # -- approvals -----------------------------------------------------------------------
    def _needs_approval(self, tool: str) -> bool:
        return tool in GATED and tool not in approvals.approvals(self.home)

    def _plan(self, tool: str, args: dict) -> Any:
        assert self.workspace is not None
        if tool == "edit":
            return files.plan_edit(self.workspace, args)
        if tool == "write":
            return files.plan_write(self.workspace, args)
        return shell.check(self.workspace, args)

    @staticmethod
    def _preview(tool: str, plan: Any) -> dict:
        if isinstance(plan, files.Change):
            return {"diff": plan.diff(), "path": shown.name(plan.label),
                    "created": plan.before is None}
        command, cwd, timeout = plan
        return {"command": shown.text(command), "cwd": shown.name(cwd), "timeout": timeout,
                "shell": " ".join(shell.SHELL)}

    async def announce(self, calls: list[dict]) -> None:
        """Plan and show every gated call of one model message, before any of them runs."""
        if self.workspace is None:
            return
        for call in calls:
            fn = call["function"]
            if fn["name"] not in GATED or not self._needs_approval(fn["name"]):
                continue
            waiting = Waiting(fn["name"], {})
            self.waiting[call["id"]] = waiting
            try:
                waiting.args = parse_arguments(fn["arguments"])
                # off the event loop: reading a 2 MiB file and diffing it takes seconds
                waiting.plan = await asyncio.to_thread(self._plan, waiting.tool, waiting.args)
                preview = await asyncio.to_thread(self._preview, waiting.tool, waiting.plan)
            except (ToolFailed, OSError) as exc:
                waiting.error = str(exc)
                continue
            await self.send({"type": "tool_approval_request", "callId": call["id"],
                             "tool": waiting.tool, "args": waiting.args,
                             "preview": preview, "approvalToken": waiting.token})
        if self.waiting:
            await self.send_queue()
            await self.send_state()

    async def decide(self, call_id: object, decision: object, always: object,
                     edited: object, token: object = None) -> None:
        """The user's answer on a card: ``allow`` (once, or always with ``always``) or
        ``deny``; ``edited`` replaces the call's arguments. ``token`` must be the card's
        secret (:class:`PermissionError` otherwise)."""
        waiting = self.waiting.get(call_id) if isinstance(call_id, str) else None
        if waiting is None or waiting.decision.done():
            raise ValueError(f"no call {call_id!r} waits for approval")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(),
                                                                  waiting.token.encode()):
            raise PermissionError("an approval must echo its card's approvalToken: only the "
                                  "page that showed the card may answer it")
        if decision not in ("allow", "deny", "always"):
            raise ValueError("decision must be 'allow', 'always' or 'deny'")
        if edited is not None and not isinstance(edited, dict):
            raise ValueError("editedArgs must be an object")
        if decision == "always" or (decision == "allow" and always is True):
            approvals.grant(waiting.tool, self.home)
            await self.send_approvals()
        waiting.decision.set_result({"decision": "deny" if decision == "deny" else "allow",
                                     "edited": edited})

    # -- running ---------------------------------------------------------------------------
    async def run(self, call: dict) -> object:
        """Run one coding call (waiting for its approval if announced); its result for the
        model. A refusal, a denial or a failure is a :class:`ToolFailed`."""
        call_id, fn = call["id"], call["function"]
        try:
            if self.workspace is None:
                raise ToolFailed("coding tools are off; the user can turn them on")
            waiting = self.waiting.get(call_id)
            if waiting is not None:
                return await self._after_approval(call_id, waiting)
            args = parse_arguments(fn["arguments"])
            if fn["name"] in READ_ONLY:
                result = await self._read_only(fn["name"], args)
                await self.send({"type": "tool_update", "callId": call_id, "kind": "text",
                                 "chunk": _summary(result)})
                return result
            plan = await asyncio.to_thread(self._plan, fn["name"], args)
            return await self._execute(call_id, plan)  # always allowed
        finally:
            if self.waiting.pop(call_id, None) is not None:
                await self.send_queue()
                await self.send_state()

    async def _read_only(self, name: str, args: dict) -> dict:
        """``read``, ``ls`` or ``grep`` on a worker thread (never on the event loop), within
        :data:`READ_DEADLINE_S`; a stopped turn or the deadline tells grep to stop at once
        (a thread cannot be killed: read and ls are bounded up front instead)."""
        assert self.workspace is not None
        budget = search.Budget(search.DEADLINE_S)
        work = functools.partial(search.grep, self.workspace, args, budget) if name == "grep" \
            else functools.partial(files.read if name == "read" else files.ls, self.workspace,
                                   args)
        try:
            return await asyncio.wait_for(asyncio.to_thread(work), READ_DEADLINE_S)
        except asyncio.TimeoutError:
            raise ToolFailed(f"{name} did not finish within {READ_DEADLINE_S:g} s "
                             "(a slow or stuck disk?)") from None
        finally:
            budget.cancel()

    async def _after_approval(self, call_id: str, waiting: Waiting) -> object:
        if waiting.error is not None:
            raise ToolFailed(waiting.error)
        answer = await waiting.decision
        if answer["decision"] != "allow":
            raise ToolFailed(f"the user denied this call{_because(answer.get('reason'))}")
        plan = waiting.plan
        if answer.get("edited") is not None:  # the user changed the arguments on the card
            plan = await asyncio.to_thread(self._plan, waiting.tool, answer["edited"])
        return await self._execute(call_id, plan)

    async def _execute(self, call_id: str, plan: Any) -> object:
        assert self.workspace is not None
        if isinstance(plan, files.Change):
            result = await asyncio.to_thread(files.apply, self.workspace, plan)
            await self.send({"type": "tool_update", "callId": call_id, "kind": "diff",
                             "chunk": await asyncio.to_thread(plan.diff)})
            return result
        command, cwd, timeout = plan

        async def chunk(text: str) -> None:
            await self.send({"type": "tool_update", "callId": call_id, "kind": "output",
                             "chunk": text})

        await self.send({"type": "tool_update", "callId": call_id, "kind": "command",
                         "chunk": f"{shown.name(cwd)}$ bash -c {command!r}\n"})
        self.command = asyncio.create_task(shell.run(
            self.workspace, {"command": command, "cwd": cwd, "timeout": timeout}, chunk))
        try:
            return await self.command
        except asyncio.CancelledError:
            if not self.command.cancelled():
                raise  # this turn itself is being cancelled, not the command by stop()
            raise ToolFailed("the command was stopped") from None
        finally:
            self.command = None


def _because(reason: object) -> str:
    return f" ({reason})" if isinstance(reason, str) and reason else ""


def _summary(result: dict) -> str:
    """What the tool's card shows (the model gets ``result`` itself): a name or a match
    with a newline in it cannot fake a line there."""
    if "content" in result:
        return shown.text(result["content"][:4096])
    if "entries" in result:
        return "\n".join(shown.line(entry) for entry in result["entries"])
    found = "\n".join(shown.line(m) for m in result.get("matches") or []) or "(no matches)"
    return found + (f"\n({result['note']})" if result.get("note") else "")
