"""The start-up builder of the run configuration (:mod:`mlxbun_core.runconfig`): the
environment read once, then the serve flags that set the same fields on top (their
values already merge flags > environment > file > defaults, :mod:`.effective`).

This is where ``mlxbun serve`` reads the environment for the code below start-up;
``mlxbun config show`` reports the same object.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..runconfig import RunConfig, env_names, from_environ, parse_fill, parse_switch

# (group, field) -> the serve option (dest) that sets it too
FLAG_FIELDS = {("engine", "fill"): "fill", ("engine", "prefill_buckets"): "prefill_buckets",
               ("engine", "thinking"): "thinking",
               ("server", "keep_volatile_system"): "keep_volatile_system"}


def build(args: argparse.Namespace | None = None) -> RunConfig:
    """The run configuration of this process: the environment's, with ``args`` (a parsed
    ``serve``) on top. ValueError names a variable whose value is wrong."""
    config = from_environ(os.environ)
    if args is None:
        return config
    engine: dict[str, Any] = {}
    if getattr(args, "fill", None) is not None:
        engine["fill"] = parse_fill(args.fill)
    if getattr(args, "prefill_buckets", None):
        engine["prefill_buckets"] = parse_switch(args.prefill_buckets, "--prefill-buckets")
    if getattr(args, "thinking", None) is not None:
        engine["thinking"] = args.thinking
    server = {"keep_volatile_system": True} if getattr(args, "keep_volatile_system",
                                                        False) else {}
    return config.changed(engine=engine, server=server)


def report(config: RunConfig, sources: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``group -> field -> {value, source}``; ``sources`` is the serve options' (the flag
    of a field that has one tells, else whether its variable is set)."""
    names = env_names()
    out: dict[str, dict[str, Any]] = {}
    for group, values in config.as_dict().items():
        for name, value in values.items():
            dest = FLAG_FIELDS.get((group, name))
            source = sources.get(dest, "default") if dest else "default"
            if source == "default" and os.environ.get(names[group, name]):
                source = f"env {names[group, name]}"
            out.setdefault(group, {})[name] = {"value": value, "source": source}
    return out
