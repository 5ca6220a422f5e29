"""The server-wide set of MCP servers from ``mlxbun.yaml``: started lazily, on the first
turn of a loopback chat client, and stopped when the server shuts down. Every chat
connection shares them (one process per stdio server, not one per tab)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from ...config.mcp import McpServerSpec
from .client import PING_S, McpServer, McpTool

MISSING_SDK = ("the mcp package is not installed (pip install 'mlxbun[mcp]', or make "
               "install); MCP servers are off")


class McpHub:
    """Every configured server, by name."""

    def __init__(self, specs: Iterable[McpServerSpec]):
        self.servers = {spec.name: McpServer(spec) for spec in specs}
        self.lock = asyncio.Lock()  # one start at a time: two tabs share the first one

    def __bool__(self) -> bool:
        return bool(self.servers)

    async def prepare(self) -> None:
        """Ping the ready servers, start every server that is due (:meth:`McpServer.due`)
        and wait for them, each within its own start bound: a server that hangs costs its
        bound once, then waits out its retry delay; it never holds a turn for longer."""
        async with self.lock:
            await asyncio.gather(*(s.alive(PING_S) for s in self.servers.values()))
            due = [s for s in self.servers.values() if s.due()]
            if due and not sdk_installed():
                for server in due:
                    server.state, server.error = "failed", MISSING_SDK
                return
            for server in due:
                server.start()
            await asyncio.gather(*(s.wait_ready(s.spec.startup_timeout) for s in due))

    def tools(self) -> dict[str, McpTool]:
        return {name: tool for s in self.servers.values() if s.state == "ready"
                for name, tool in s.tools.items()}

    def server_of(self, tool: str) -> McpServer | None:
        return self.servers.get(tool.partition("__")[0]) if "__" in tool else None

    def status(self) -> list[dict]:
        """Each server's state for the page's status line."""
        return [{"name": s.spec.name, "state": s.state, "where": s.spec.where,
                 "tools": sorted(s.tools), "error": s.error, "notes": s.notes,
                 "lastFailure": s.last_failure}
                for s in self.servers.values()]

    async def close(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers.values()),
                             return_exceptions=True)


def sdk_installed() -> bool:
    try:
        import mcp  # noqa: F401
    except ImportError:
        return False
    return True
