"""The ``mcp_servers:`` section of ``mlxbun.yaml``: MCP servers whose tools the web chat
offers (:mod:`mlxbun_core.webchat.mcp`). Each entry is a stdio command or a streamable-HTTP
URL, checked here so that a mistake is a :class:`~.yamlfile.ConfigError` naming its line::

    mcp_servers:
      notes:                          # tools appear as notes__<tool>
        command: npx
        args: ["-y", "@modelcontextprotocol/server-filesystem", "/home/me/notes"]
        env: {LOG_LEVEL: info}        # added to a small safe environment, never ours
      search:
        url: http://127.0.0.1:8931/mcp
        headers: {Authorization: "Bearer ..."}
        timeout: 30                   # seconds a call may take (default 60)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

NAME = re.compile(r"^[A-Za-z0-9-]+(?:_[A-Za-z0-9-]+)*$")  # no "__": it separates the tool
MAX_NAME = 24
DEFAULT_TIMEOUT_S = 60.0
MAX_TIMEOUT_S = 3600.0
DEFAULT_STARTUP_S = 30.0
DEFAULT_MAX_OUTPUT = 64 * 1024
KEYS = ("command", "args", "env", "cwd", "url", "headers", "timeout", "startup_timeout",
        "max_output")


@dataclass(frozen=True)
class McpServerSpec:
    """One entry of ``mcp_servers:``: ``command`` (stdio) or ``url`` (streamable HTTP)."""

    name: str
    line: int
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout: float = DEFAULT_TIMEOUT_S  # one call, seconds
    startup_timeout: float = DEFAULT_STARTUP_S  # start, handshake and tool listing
    max_output: int = DEFAULT_MAX_OUTPUT  # characters of one result the model is shown

    @property
    def where(self) -> str:
        """The command line or the URL, for status lines and logs."""
        return self.url or " ".join((self.command or "", *self.args))


def read_mcp_servers(reader: Any, node: yaml.Node) -> dict[str, McpServerSpec]:
    """Every server of the section; ``reader`` is yamlfile's ``_Reader``."""
    out = {}
    for name, v in reader.mapping(node, "mcp_servers"):
        if not NAME.match(name) or len(name) > MAX_NAME:
            raise reader.fail(reader.key_of(v), f"MCP server name {name!r} must be letters, "
                              f"digits, - and single _ (at most {MAX_NAME})")
        values: dict[str, Any] = {}
        for key, item in reader.mapping(v, f"mcp_servers.{name}"):
            if key not in KEYS:
                raise reader.fail(reader.key_of(item), f"unknown setting mcp_servers.{name}."
                                  f"{key} (settings: {', '.join(KEYS)})")
            values[key] = _checked(reader, item, f"mcp_servers.{name}.{key}", key)
        if ("command" in values) == ("url" in values):
            raise reader.fail(v, f"mcp_servers.{name} needs command (stdio) or url "
                              "(streamable HTTP), not both")
        wrong = [k for k in (("args", "env", "cwd") if "url" in values else ("headers",))
                 if k in values]
        if wrong:
            raise reader.fail(v, f"mcp_servers.{name}: {wrong[0]} does not go with "
                              + ("url" if "url" in values else "command"))
        out[name] = McpServerSpec(name=name, line=int(v.start_mark.line) + 1, **values)
    return out


def _checked(reader: Any, node: yaml.Node, where: str, key: str) -> Any:
    value = reader.value(node)
    if key in ("command", "cwd", "url"):
        if not isinstance(value, str) or not value.strip():
            raise reader.fail(node, f"{where} must be a non-empty string")
        if key == "url" and not value.startswith(("http://", "https://")):
            raise reader.fail(node, f"{where} must be an http:// or https:// URL")
        return value.strip()
    if key == "args":
        if not isinstance(value, list) or not all(isinstance(a, (str, int, float))
                                                  and not isinstance(a, bool) for a in value):
            raise reader.fail(node, f"{where} must be a list of strings")
        return tuple(str(a) for a in value)
    if key in ("env", "headers"):
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(x, (str, int, float)) and not isinstance(x, bool)
                for k, x in value.items()):
            raise reader.fail(node, f"{where} must be a mapping of names to strings")
        return {k: str(x) for k, x in value.items()}
    if key == "max_output":
        if isinstance(value, bool) or not isinstance(value, int) or value < 256:
            raise reader.fail(node, f"{where} must be a character count (at least 256)")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_TIMEOUT_S:
        raise reader.fail(node, f"{where} must be a number of seconds (0 < s <= "
                          f"{MAX_TIMEOUT_S:g})")
    return float(value)
