"""The effective serve settings: flags > environment (``MLXBUN_*``) > the config file >
built-in defaults, with where each value came from.

Nothing here keeps a table of flags or variables: which flags were typed is found by
parsing the command line again with every default suppressed, and which ``MLXBUN_*``
variable set a default by building the parser again without (or with a changed) value
of each variable that is set.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..models.paths import mlxbun_home
from .schema import serve_options, serve_subparser
from .yamlfile import ConfigError, ConfigFile, ModelSettings, read_config

FILE_NAME = "mlxbun.yaml"
ParserFactory = Callable[[], argparse.ArgumentParser]

# what an --isolate engine child takes from the file itself: the parent passes on what
# was typed, the file's serve values are read again here, minus what only the parent uses
CHILD_SKIPS = {"isolate", "model_pool", "host", "port", "model", "query", "pins",
               "allow_models", "keep_alive", "api_key", "no_open", "cors"}


@dataclass
class Settings:
    """What ``args.settings`` holds after :func:`apply_config`."""

    file: ConfigFile | None
    # dest -> "flag", "env NAME", "file:PATH:LINE" or "default"
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def aliases(self) -> dict[str, str]:
        return {k: v.value for k, v in self.file.aliases.items()} if self.file else {}

    def resolve(self, name: str) -> str:
        """A model name with an alias replaced by its target (one step: no chains)."""
        return self.aliases.get(name, name)

    def model(self, model_id: str) -> ModelSettings | None:
        """``models:`` entry for ``model_id``: by the id itself, else by an alias of it."""
        if self.file is None:
            return None
        if model_id in self.file.models:
            return self.file.models[model_id]
        for name, settings in self.file.models.items():
            if self.resolve(name) == model_id:
                return settings
        return None

    def from_file(self, dest: str) -> bool:
        return self.sources.get(dest, "").startswith("file:")


def config_path(args: argparse.Namespace) -> tuple[Path | None, bool]:
    """``(path, named)``: ``--config FILE`` (or ``MLXBUN_CONFIG``), else
    ``<home>/mlxbun.yaml`` when it exists; ``named`` when the user named it (it must exist)."""
    named = getattr(args, "config_file", None) or os.environ.get("MLXBUN_CONFIG")
    if named:
        return Path(named).expanduser().resolve(), True
    default = mlxbun_home() / FILE_NAME
    return (default, False) if default.is_file() else (None, False)


def apply_config(args: argparse.Namespace, argv: Sequence[str],
                 factory: ParserFactory) -> Settings:
    """Fill ``args`` (a parsed ``serve``) from the config file where neither a flag nor an
    environment variable set the value; ``args.settings`` then says where each came from.
    Raises :class:`ConfigError`."""
    parser = factory()
    options = serve_options(parser)
    path, named = config_path(args)
    if path is not None and named and not path.is_file():
        raise ConfigError(path, None, "no such config file")
    file = read_config(path, options) if path is not None else None
    sources = sources_of(argv, factory)
    child = bool(getattr(args, "unix", None))
    if file is not None:
        for dest, located in file.serve.items():
            if sources.get(dest) != "default" or (child and dest in CHILD_SKIPS):
                continue
            setattr(args, dest, located.value)
            sources[dest] = f"file:{file.path}:{located.line}"
    settings = Settings(file, sources)
    _resolve_model_alias(args, settings)
    args.settings = settings
    return settings


def _resolve_model_alias(args: argparse.Namespace, settings: Settings) -> None:
    for dest in ("model", "positional", "query"):
        name = getattr(args, dest, None)
        if isinstance(name, str) and name in settings.aliases:
            setattr(args, dest, settings.resolve(name))


def sources_of(argv: Sequence[str], factory: ParserFactory) -> dict[str, str]:
    """dest -> ``flag``, ``env NAME`` or ``default`` for every serve option."""
    dests = list(serve_options(factory()))
    typed = _typed(argv, factory)
    env = _env_sources(factory)
    return {d: "flag" if d in typed else f"env {env[d]}" if d in env else "default"
            for d in dests}


def _typed(argv: Sequence[str], factory: ParserFactory) -> set[str]:
    parser = factory()
    for action in serve_subparser(parser)._actions:
        if action.dest != "help":
            action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(list(argv)))) - {"command"}


def _serve_defaults(factory: ParserFactory) -> dict[str, Any]:
    return {a.dest: a.default for a in serve_subparser(factory())._actions}


@contextmanager
def _env(var: str, value: str | None):
    saved = os.environ.get(var)
    if value is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved


def _env_sources(factory: ParserFactory) -> dict[str, str]:
    """dest -> the ``MLXBUN_*`` variable that set its default now."""
    base = _serve_defaults(factory)
    out: dict[str, str] = {}
    for var in sorted(v for v in os.environ if v.startswith("MLXBUN_")):
        for probe in (None, _perturbed(os.environ[var])):
            try:
                with _env(var, probe):
                    changed = [d for d, v in _serve_defaults(factory).items() if v != base[d]]
            except (ValueError, TypeError):
                continue
            if changed:  # unset, or (a value equal to the default) changed
                out.update(dict.fromkeys(changed, var))
                break
    return out


def _perturbed(value: str) -> str:
    """A different value of the same kind (a number stays a number)."""
    try:
        return str(int(value) + 1)
    except ValueError:
        pass
    try:
        return str(float(value) + 1.0)
    except ValueError:
        pass
    return {"1": "0", "true": "false", "on": "off", "yes": "no"}.get(value.lower(), value + "x")
