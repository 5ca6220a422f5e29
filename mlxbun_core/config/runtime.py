"""The start-up builder of the run configuration (:mod:`mlxbun_core.runconfig`): the
environment read once, then the serve flags that set the same fields on top (their
values already merge flags > environment > file > defaults, :mod:`.effective`).

This is where ``mlxbun serve`` reads the environment for the code below start-up;
``mlxbun config show`` reports the same object.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from ..env_readers import FALLBACKS, parse_fill, parse_switch
from ..runconfig import RunConfig, env_names, from_environ

# (group, field) -> the serve option (dest) that sets it too
FLAG_FIELDS = {("engine", "fill"): "fill", ("engine", "prefill_buckets"): "prefill_buckets",
               ("engine", "thinking"): "thinking",
               ("server", "keep_volatile_system"): "keep_volatile_system",
               ("server", "allow_private_media"): "allow_private_media",
               ("process", "no_open"): "no_open"}
# switches a serve flag can only turn on (off is their default, or their variable's)
_FLAG_SWITCHES = {("server", "keep_volatile_system"), ("server", "allow_private_media"),
                  ("process", "no_open")}


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
    switched: dict[str, dict[str, Any]] = {}
    for group, name in _FLAG_SWITCHES:
        if getattr(args, FLAG_FIELDS[group, name], False):
            switched.setdefault(group, {})[name] = True
    return config.changed(engine=engine, **switched)


def report(config: RunConfig, sources: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``group -> field -> {value, source}``; ``sources`` is the serve options' (the flag
    of a field that has one tells, else whether its variable is set)."""
    names = env_names()
    out: dict[str, dict[str, Any]] = {}
    for group, values in config.as_dict().items():
        for name, value in values.items():
            dest = FLAG_FIELDS.get((group, name))
            source = sources.get(dest, "default") if dest else "default"
            if source == "default":
                source = _env_source(os.environ, names[group, name],
                                     FALLBACKS.get((group, name), ((), None))[0])
            out.setdefault(group, {})[name] = {"value": value, "source": source}
    return out


def _env_source(environ: Mapping[str, str], var: str, others: tuple[str, ...]) -> str:
    """``env NAME`` of the variable that set a field (its own, else a fallback), or
    ``default``."""
    return next((f"env {v}" for v in (var, *others) if environ.get(v)), "default")


# variables of the reference that mean nothing on this engine: set, the server refuses to
# start and says why (a switch that does nothing is never silently accepted)
REFUSED_VARIABLES = {
    "MLXBUN_BATCH_EXTEND": "the batch keeps KV in paged blocks, so a joining row only gets "
                           "a block table: there is no whole-batch re-merge to switch to or "
                           "from",
    "MLXBUN_QWEN_SPEC_KV4": "speculation (draft model, prompt lookup, MTP) is not gated on "
                            "the KV scheme here: it already runs under every --kv-quant, so "
                            "there is no KV4 gate to open or close",
    "MLXBUN_MTP_PROMPT_CACHE": "MTP requests start from the prefix cache like every other "
                               "request (on both lanes); to run without prefix reuse, use "
                               "--prompt-cache 0",
}


def start_refusals(environ: Mapping[str, str] | None = None) -> list[str]:
    """Why this environment cannot start a server (empty: it can): a refused variable that
    is set, or a variable whose value is wrong."""
    env = os.environ if environ is None else environ
    out = [f"{var} is refused: {why}" for var, why in REFUSED_VARIABLES.items()
           if env.get(var)]
    try:
        from_environ(env)
    except ValueError as exc:
        out.append(str(exc))
    return out
