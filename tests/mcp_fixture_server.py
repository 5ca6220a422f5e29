"""A small MCP server for the web chat's MCP tests, on the official SDK's MCPServer (the
former FastMCP): ``python mcp_fixture_server.py stdio`` or ``... http PORT``.

Every call is appended to ``$FIXTURE_LOG`` (and the server's pid at start), so a test can
tell that a denied call never ran, that a timed-out one was cancelled on the server's side,
and that a stopped server's process is gone.
"""

from __future__ import annotations

import asyncio
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("fixture")


def note(line: str) -> None:
    path = os.environ.get("FIXTURE_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    note(f"echo {text}")
    return f"echo: {text}"


@server.tool()
def big(n: int) -> str:
    """Return n characters."""
    note(f"big {n}")
    return "x" * n


@server.tool()
async def hang(ctx: Context) -> str:
    """Never answer; noted when the client cancels it (the test checks the connection is
    still open then, so only a cancellation can have ended it)."""
    note(f"hang {ctx.request_id}")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        note(f"hang {ctx.request_id} cancelled")
        raise
    return "woke"


@server.tool()
def crash() -> str:
    """End the server mid-call."""
    note("crash")
    sys.stderr.write("fixture crashing on purpose\n")
    sys.stderr.flush()
    os._exit(3)


if __name__ == "__main__":
    note(f"pid {os.getpid()}")
    if sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
