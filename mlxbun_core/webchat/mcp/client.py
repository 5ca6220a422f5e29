"""One configured MCP server, through the official ``mcp`` SDK: started on demand, its
tools listed under ``<server>__<tool>``, calls bounded in time and size, its end noticed.

The SDK's :class:`mcp.Client` lives inside anyio task groups, which must be entered and
left by one task: a holder task (:meth:`McpServer._hold`) owns the connection from start
to stop, and calls are made on it from the turns' tasks. A server that fails to start,
crashes or stops answering never holds a turn: every wait here has a bound, and what
went wrong (with the end of a stdio server's stderr) becomes :attr:`McpServer.error`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any, TextIO, cast

from ...config.mcp import McpServerSpec
from ..apptools import ToolFailed

log = logging.getLogger("mlxbun.webchat")

SEP = "__"  # server__tool: the server's name never holds it (config/mcp.py)
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
MAX_TOOL_NAME = 64  # OpenAI's limit on a function name, and the approvals store's
MAX_TOOLS = 128  # per server: a listing past this is cut (a prompt has room for only so many)
MAX_PAGES = 20
STDERR_TAIL = 1500  # characters of a stdio server's stderr quoted when it fails
STOP_S = 5.0  # for a holder to close its connection (the SDK gives a stdio server 2 s)
PING_S = 5.0  # a ready server lists its tools again before each turn within this
RETRY_START_S = 30.0  # a server that failed to start is tried again after this long


@dataclass(frozen=True)
class McpTool:
    """One tool as the chat offers it: the namespaced function and the server's own name."""

    name: str  # server__tool
    remote: str  # the tool's name on its server
    function: dict[str, Any]  # the OpenAI tool entry


def namespaced(server: str, tool: str) -> str | None:
    """``server__tool`` with characters a function name cannot hold made ``_``; None when
    too long to be a tool name."""
    name = f"{server}{SEP}{_UNSAFE.sub('_', tool)}"
    return name if len(name) <= MAX_TOOL_NAME else None


class McpServer:
    """One server's connection: ``idle`` → ``starting`` → ``ready``, or ``failed``."""

    def __init__(self, spec: McpServerSpec):
        self.spec = spec
        self.state = "idle"
        self.error: str | None = None
        self.last_failure: str | None = None
        self.tools: dict[str, McpTool] = {}
        self.notes: list[str] = []  # tools left out, and why
        self.failed_at = 0.0
        self.started_once = False  # the last failure was a start that never got ready
        self._client: Any = None
        self._task: asyncio.Task | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._errlog: IO[str] | None = None
        self._ending: set[asyncio.Task] = set()  # holders let go, still closing

    # -- lifecycle --------------------------------------------------------------------------
    def due(self) -> bool:
        """Whether a turn should start this server now: never started, or it failed (a
        start that failed waits :data:`RETRY_START_S` before another try)."""
        if self.state == "idle":
            return True
        if self.state != "failed":
            return False
        return self.started_once or time.monotonic() - self.failed_at >= RETRY_START_S

    def start(self) -> None:
        self.last_failure = self.error or self.last_failure  # shown after a restart too
        self.state, self.error, self.tools, self.notes = "starting", None, {}, []
        self._ready, self._stop = asyncio.Event(), asyncio.Event()
        self._task = asyncio.create_task(self._hold(), name=f"mcp:{self.spec.name}")

    async def wait_ready(self, timeout: float) -> None:
        """Until ready or failed; past ``timeout`` (and the server's own start bound) a
        start that hangs is given up and its process stopped."""
        if self.state != "starting":
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._ready.wait()), timeout)
        except asyncio.TimeoutError:
            if self.state == "starting":
                self._fail(f"did not start within {timeout:g} s", started=False)
                self._abandon()

    async def alive(self, timeout: float) -> None:
        """A ready server lists its tools again within ``timeout`` (a tool added or changed
        since shows in the next turn), or is failed and let go: a server that died or hangs
        between turns leaves the next turn without its tools. (MCP's ping is gone from the
        2026 protocol; a listing works on every version.)"""
        client = self._client
        if self.state != "ready" or client is None:
            return
        try:
            tools, notes = await asyncio.wait_for(self._list(client, "refresh"), timeout)
            if self._client is client:
                self.tools, self.notes = tools, notes
        except Exception as exc:
            why = f"no answer within {timeout:g} s" \
                if isinstance(exc, asyncio.TimeoutError) else describe(exc)
            self._fail(f"the server stopped ({why})", started=True)
            self._abandon()

    def _abandon(self) -> None:
        """Let the holder go: it ends (and its process with it) in the background."""
        self._stop.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            self._ending.add(self._task)
            self._task.add_done_callback(self._ending.discard)

    async def stop(self) -> None:
        """Close the connection (a stdio server's process ends with it)."""
        self._stop.set()
        task = self._task
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), STOP_S)
            except (asyncio.TimeoutError, Exception):
                self._abandon()
        pending = [t for t in self._ending if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=STOP_S)
        if self.state != "failed":
            self.state = "stopped"

    def _fail(self, why: str, started: bool) -> None:
        tail = self._stderr_tail()
        self.error = why + (f"; it said: {tail}" if tail else "")
        self.state, self.failed_at, self.started_once = "failed", time.monotonic(), started
        self.tools, self._client = {}, None
        self._ready.set()
        log.warning("mcp server %s (%s) failed: %s", self.spec.name, self.spec.where, self.error)

    def _stderr_tail(self) -> str:
        if self._errlog is None or self._errlog.closed:  # closed: the holder has ended
            return ""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            return " ".join(self._errlog.read()[-STDERR_TAIL:].split())
        except (OSError, ValueError):
            return ""

    async def _hold(self) -> None:
        """The holder task: connect, list the tools, wait for stop; any end is reported.
        A holder replaced by a newer start (:meth:`start` after a failure) reports nothing."""
        from mcp import Client

        stop = self._stop

        def current() -> bool:
            return self._task is asyncio.current_task() and not stop.is_set()

        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
            self._errlog = errlog  # read by _fail while open: a stdio server's last words
            try:
                async with Client(self._transport(errlog)) as client:
                    tools, notes = await self._list(client)
                    if current():
                        self.tools, self.notes, self._client = tools, notes, client
                        self.state = "ready"
                        self._ready.set()
                        log.info("mcp server %s ready: %d tools", self.spec.name, len(tools))
                    await stop.wait()
                    if self._client is client:
                        self._client = None
                if current():
                    self._fail("the connection ended", started=self.state == "ready")
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # an ExceptionGroup from the SDK's task groups too
                if current():
                    self._fail(describe(exc), started=self.state == "ready")

    def _transport(self, errlog: IO[str]) -> Any:
        spec = self.spec
        if spec.url is not None:
            import httpx2
            from mcp.client.streamable_http import streamable_http_client

            # the SDK's own timeouts (30 s to connect, 300 s to read a held stream)
            http = httpx2.AsyncClient(headers=spec.headers,
                                      timeout=httpx2.Timeout(30.0, read=300.0))
            return streamable_http_client(spec.url, http_client=http)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        params = StdioServerParameters(command=spec.command or "", args=list(spec.args),
                                       env=spec.env or None, cwd=spec.cwd)
        return stdio_client(params, errlog=cast(TextIO, errlog))  # a real file: it has a fd

    async def _list(self, client: Any, cache_mode: str = "use"
                    ) -> tuple[dict[str, McpTool], list[str]]:
        tools: dict[str, McpTool] = {}
        notes: list[str] = []
        cursor = None
        for _ in range(MAX_PAGES):
            page = await client.list_tools(cursor=cursor, cache_mode=cache_mode)
            for tool in page.tools:
                name = namespaced(self.spec.name, tool.name)
                if name is None or name in tools:
                    notes.append(f"{tool.name!r} left out: " + ("its name is too long"
                                 if name is None else f"{name} is taken"))
                elif len(tools) >= MAX_TOOLS:
                    notes.append(f"{tool.name!r} left out: more than {MAX_TOOLS} tools")
                else:
                    tools[name] = McpTool(name, tool.name, _function(name, tool))
            cursor = page.next_cursor
            if not cursor:
                break
        return tools, notes

    # -- calls ----------------------------------------------------------------------------
    async def call(self, tool: McpTool, args: dict) -> dict:
        """Run ``tool``; its result for the model, or :class:`ToolFailed` (refused, an
        error result, timed out, the server gone)."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        client, timeout = self._client, self.spec.timeout
        if self.state != "ready" or client is None:
            raise ToolFailed(f"MCP server {self.spec.name} is not running"
                             + (f": {self.error}" if self.error else ""))
        # past ``timeout`` the SDK tells the server to stop (``notifications/cancelled``
        # for the request id; over HTTP at 2026-07-28 it ends the request's stream), and so
        # does our outer bound's cancellation: a timed-out tool never runs on unseen
        try:
            result = await asyncio.wait_for(
                client.call_tool(tool.remote, args, read_timeout_seconds=timeout), timeout + 1)
        except asyncio.TimeoutError:
            raise ToolFailed(f"{tool.name} did not answer within {timeout:g} s") from None
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise ToolFailed(f"{tool.name} did not answer within {timeout:g} s") from None
            if exc.code == CONNECTION_CLOSED:
                raise self._died(exc) from None
            raise ToolFailed(f"{tool.name} refused the call: {exc.error.message}") from None
        except Exception as exc:  # the transport broke under the call
            raise self._died(exc) from None
        text, note = capped(result_text(result), self.spec.max_output)
        if result.is_error:
            raise ToolFailed(text or f"{tool.name} failed")
        return {"content": text, **({"note": note} if note else {})}

    def _died(self, exc: BaseException) -> ToolFailed:
        self._fail(f"the server stopped ({describe(exc)})", started=True)
        self._abandon()
        return ToolFailed(f"MCP server {self.spec.name} stopped during the call: {self.error}")


def _function(name: str, tool: Any) -> dict[str, Any]:
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    if schema.get("type") != "object":
        schema = {"type": "object", "properties": {}}
    description = (tool.description or tool.title or "")[:1024]
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": schema}}


def describe(exc: BaseException) -> str:
    """A failure in one line: an ExceptionGroup's first leaf, by type and message."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (the SDK's task groups)
        exc = exc.exceptions[0]  # type: ignore[attr-defined]  # getattr above checked it
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def result_text(result: Any) -> str:
    """A tool result's content as text: text parts as they are, other parts named."""
    parts: list[str] = []
    for item in result.content:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {item.mime_type}, {len(item.data) * 3 // 4} bytes, not shown]")
        elif kind == "resource_link":
            parts.append(f"[resource {item.uri}]")
        elif kind == "resource":
            body = getattr(item.resource, "text", None)
            parts.append(body if isinstance(body, str) else f"[resource {item.resource.uri}]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


def capped(text: str, limit: int) -> tuple[str, str | None]:
    """``text`` cut to ``limit`` characters, and the note saying so."""
    if len(text) <= limit:
        return text, None
    return text[:limit], f"output truncated: the first {limit} of {len(text)} characters"
