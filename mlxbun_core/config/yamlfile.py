"""Reading ``mlxbun.yaml``: every value with the line it sits on, every mistake a
:class:`ConfigError` naming the file and that line (from yaml's node marks).

The file has four sections, all optional::

    serve:        any ``mlxbun serve`` flag by its long name (checked as the flag would be)
    aliases:      short names clients may ask for -> model ids
    models:       per model (an id or an alias): sampling defaults, max_tokens,
                  chat_template_kwargs, keep_alive, context_length
    mcp_servers:  MCP servers whose tools the web chat offers (:mod:`.mcp`)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..request_fields import per_model_names
from .duration import parse_keep_alive
from .mcp import McpServerSpec, read_mcp_servers
from .schema import Option, convert, key_aliases

SECTIONS = ("serve", "aliases", "models", "mcp_servers")
# per-model sampling defaults: the request field names (a request's own value wins)
SAMPLING_KEYS = per_model_names()
MODEL_KEYS = (*SAMPLING_KEYS, "max_tokens", "chat_template_kwargs", "keep_alive",
              "context_length")


class ConfigError(Exception):
    """A config file mistake: ``str()`` is ``FILE:LINE: what is wrong``."""

    def __init__(self, path: Path | str, line: int | None, message: str):
        self.path, self.line, self.message = Path(path), line, message
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Located:
    """A value from the file and the (1-based) line it is on."""

    value: Any
    line: int


@dataclass
class ModelSettings:
    """One model's entry under ``models:``."""

    key: str  # as written: a model id or an alias
    line: int
    sampling: dict[str, Any] = field(default_factory=dict)
    max_tokens: int | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    keep_alive: float | None = None  # seconds (math.inf: forever); None: the server's
    context_length: int | None = None  # the window served (None: the server's)
    lines: dict[str, int] = field(default_factory=dict)


@dataclass
class ConfigFile:
    path: Path
    serve: dict[str, Located] = field(default_factory=dict)  # by argparse dest, converted
    aliases: dict[str, Located] = field(default_factory=dict)
    models: dict[str, ModelSettings] = field(default_factory=dict)
    mcp_servers: dict[str, McpServerSpec] = field(default_factory=dict)


def read_config(path: Path, options: dict[str, Option]) -> ConfigFile:
    """Parse and check ``path`` against the serve ``options``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read the config file: {exc.strerror}") from None
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(path, mark.line + 1 if mark else None,
                          f"not valid YAML: {getattr(exc, 'problem', exc)}") from None
    finally:
        loader.dispose()
    out = ConfigFile(path=path)
    if root is None:
        return out  # an empty file
    reader = _Reader(path, loader)
    for key, node in reader.mapping(root, "the top level"):
        if key not in SECTIONS:
            raise ConfigError(path, _line(reader.key_of(node)), f"unknown section {key!r} "
                              "(sections: " + ", ".join(SECTIONS) + ")")
        if key == "serve":
            out.serve = reader.serve(node, options)
        elif key == "aliases":
            out.aliases = reader.aliases(node)
        elif key == "mcp_servers":
            out.mcp_servers = read_mcp_servers(reader, node)
        else:
            out.models = reader.models(node)
    return out


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1


class _Reader:
    def __init__(self, path: Path, loader: yaml.SafeLoader):
        self.path, self.loader = path, loader
        self.keys: dict[int, yaml.Node] = {}  # id(value node) -> its key's node

    def fail(self, node: yaml.Node, message: str) -> ConfigError:
        return ConfigError(self.path, _line(node), message)

    def value(self, node: yaml.Node) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            raise self.fail(node, f"not a valid value: {exc}") from None

    def mapping(self, node: yaml.Node, what: str) -> list[tuple[str, yaml.Node]]:
        """``(key, value node)`` pairs of a mapping whose keys are strings, no repeats
        (:attr:`keys` then holds each key's own node, for errors about the key)."""
        if not isinstance(node, yaml.MappingNode):
            raise self.fail(node, f"{what} must be a mapping of names to values")
        seen: set[str] = set()
        out = []
        for k, v in node.value:
            key = self.value(k)
            if not isinstance(key, str):
                raise self.fail(k, f"keys of {what} must be strings (got {key!r})")
            if key in seen:
                raise self.fail(k, f"{key!r} appears twice in {what}")
            seen.add(key)
            self.keys[id(v)] = k
            out.append((key, v))
        return out

    def key_of(self, value: yaml.Node) -> yaml.Node:
        return self.keys.get(id(value), value)

    def serve(self, node: yaml.Node, options: dict[str, Option]) -> dict[str, Located]:
        names = key_aliases(options)
        out: dict[str, Located] = {}
        for key, v in self.mapping(node, "serve"):
            dest = names.get(key)
            if dest is None:
                raise self.fail(self.key_of(v), f"unknown serve setting {key!r} (the keys are "
                                "`mlxbun serve` flags: see mlxbun serve --help)")
            if dest in out:
                raise self.fail(v, f"{key!r} sets {options[dest].flag} a second time")
            try:
                out[dest] = Located(convert(options[dest], self.value(v)), _line(v))
            except ValueError as exc:
                raise self.fail(v, str(exc)) from None
        return out

    def aliases(self, node: yaml.Node) -> dict[str, Located]:
        out = {}
        for key, v in self.mapping(node, "aliases"):
            target = self.value(v)
            if not isinstance(target, str) or not target.strip():
                raise self.fail(v, f"alias {key!r} must name a model id (a string)")
            if target == key:
                raise self.fail(v, f"alias {key!r} names itself")
            out[key] = Located(target.strip(), _line(v))
        return out

    def models(self, node: yaml.Node) -> dict[str, ModelSettings]:
        out = {}
        for name, v in self.mapping(node, "models"):
            settings = ModelSettings(key=name, line=_line(v))
            for key, item in self.mapping(v, f"models.{name}"):
                self._model_setting(settings, name, key, item)
            out[name] = settings
        return out

    def _model_setting(self, s: ModelSettings, name: str, key: str, node: yaml.Node) -> None:
        from ..engine.sampling import SamplingParams
        from ..errors import APIError

        value, where = self.value(node), f"models.{name}.{key}"
        if key not in MODEL_KEYS:
            raise self.fail(self.key_of(node), f"unknown setting {where} (per-model settings: "
                            + ", ".join(MODEL_KEYS) + ")")
        s.lines[key] = _line(node)
        if key == "keep_alive":
            try:
                s.keep_alive = parse_keep_alive(value)
            except ValueError as exc:
                raise self.fail(node, f"{where}: {exc}") from None
        elif key == "chat_template_kwargs":
            if not isinstance(value, dict):
                raise self.fail(node, f"{where} must be a mapping")
            s.template_kwargs = dict(value)
        elif key == "max_tokens":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise self.fail(node, f"{where} must be a token count (0: no cap)")
            s.max_tokens = value
        elif key == "context_length":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise self.fail(node, f"{where} must be a positive integer")
            s.context_length = value
        else:  # the request's own checks, so a default can never be a value a request can't
            try:
                SamplingParams.from_body({key: value})
            except APIError as exc:
                raise self.fail(node, f"models.{name}: {exc.message}") from None
            s.sampling[key] = value
