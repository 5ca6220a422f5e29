"""MCP servers' tools in the web chat: :mod:`.client` holds one server's connection (the
official ``mcp`` SDK), :mod:`.hub` all of ``mlxbun.yaml``'s ``mcp_servers:`` for the whole
server, :mod:`.session` one connection's tools and their approval cards.
"""
