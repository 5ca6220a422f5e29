"""``mlxbun serve --isolate``: pick the model, build the engine argv, run the parent.

The parent resolves the model from the local library (never converting or
loading anything) and pins ``--model <dir>`` on its engine children; a name it
cannot place locally (a ``.gguf`` file, a hub id to download) is passed through
for the child to resolve. Every serve flag except the parent-only ones
(``--isolate``, ``--host``, ``--port``, ``--model-pool``, ``--unix`` and the model
selectors) reaches the children unchanged, and so does the environment (the API
key travels there, as ``MLXBUN_API_KEY``, never on a command line).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path

from ..library.cache import LibraryCache
from ..library.scan import scan
from ..models.paths import DEFAULT_MODEL_ID, model_id_for_dir
from ..models.resolve import ModelNotFound, library_match
from ..selection import chosen_model, report_selection_error
from .policy import PoolPolicy
from .pool import EnginePool, ModelSpec

log = logging.getLogger("mlxbun.isolate")

# parent-only flags, plus the API key: children get it in their environment, where other
# local users cannot read it (a command line is visible to everyone in ps)
PARENT_ONLY = {"isolate", "model_pool", "host", "port", "unix", "model", "query", "positional",
               "help", "api_key", "keep_alive", "pins", "allow_models", "cors",
               # the connection guard is the parent's: children answer only it, on a socket
               "max_connections", "idle_timeout", "header_timeout", "body_min_rate"}


def engine_argv(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The serve flags the operator set (non-default), minus the parent-only ones and
    the config file's values (a child reads the file itself: ``--config`` goes along)."""
    serve = _subparser(parser, "serve")
    settings = getattr(args, "settings", None)
    out = []
    for action in serve._actions:
        if not action.option_strings or action.dest in PARENT_ONLY:
            continue
        if settings is not None and settings.from_file(action.dest):
            continue
        value = getattr(args, action.dest, action.default)
        if value == action.default:
            continue
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") \
            else action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            out.append(flag)
        elif value is not None:
            out += [flag, str(value)]
    return out


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def default_spec(name: str | None) -> ModelSpec:
    """What the default engine serves, decided without loading or converting anything."""
    if name is None:
        return ModelSpec(DEFAULT_MODEL_ID, None)
    p = Path(name).expanduser()
    if p.is_dir() and (p / "config.json").is_file():
        return ModelSpec(model_id_for_dir(p.resolve()), str(p.resolve()))
    if not p.exists():
        found = library_match(name, scan())  # AmbiguousModel propagates: the CLI lists candidates
        if found is not None:
            return ModelSpec(found.model_id, str(found.path))
    return ModelSpec(p.stem if p.suffix.lower() == ".gguf" else name, name)


def pool_setup(args: argparse.Namespace, default: ModelSpec, library: LibraryCache
               ) -> tuple[tuple[ModelSpec, ...], PoolPolicy, Callable[[str], float | None]]:
    """``(pins, policy, per-model keep-alive)`` from the flags and the config file; a pin
    that is no local model, or more pins than the pool holds, is a :class:`PoolError`."""
    settings = getattr(args, "settings", None)
    aliases: dict[str, str] = settings.aliases if settings is not None else {}
    policy = PoolPolicy(aliases=aliases)
    pins = []
    for name in args.pins or ():
        model_id = policy.resolve(name)
        if model_id == default.id:
            pins.append(default)
            continue
        entry = library.find(model_id)
        if entry is None:
            raise PoolError(f"--pin {name}: no local model {model_id!r} (mlxbun ls lists them)")
        pins.append(ModelSpec(entry.id, str(entry.path)))
    if args.model_pool <= 1 and any(p.id != default.id for p in pins):
        raise PoolError("--pin of a model other than the default needs --model-pool 2 or more "
                        "(one engine serves only the default)")
    if len({p.id for p in pins}) > max(1, args.model_pool):
        raise PoolError(f"{len(pins)} pinned models need --model-pool {len(pins)} or more")
    if args.allow_models:
        allowed = {policy.resolve(n) for n in args.allow_models} | {default.id}
        policy = PoolPolicy(aliases=aliases, allowed=frozenset(allowed | {p.id for p in pins}))
    typed = settings is not None and not settings.from_file("keep_alive") and \
        args.keep_alive is not None

    def model_keep_alive(model_id: str) -> float | None:
        entry = settings.model(model_id) if settings is not None and not typed else None
        return entry.keep_alive if entry is not None else None

    return tuple(pins), policy, model_keep_alive


class PoolError(Exception):
    """The pool's flags cannot be met (said on stderr, exit status 2)."""


def run_parent(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import uvicorn

    from ..kvquant import parse as parse_kv_quant
    from ..server.connections import limits_from_args, uvicorn_settings
    from .drain import ParentServer
    from .parent import ParentApp

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request is noise
    try:
        spec = default_spec(chosen_model(args, probe_mlx=False))
    except ModelNotFound as exc:
        return report_selection_error(exc)
    library = LibraryCache()

    def lookup(model_id: str):
        entry = library.find(model_id)
        return ModelSpec(entry.id, str(entry.path)) if entry else None

    try:
        pins, policy, model_keep_alive = pool_setup(args, spec, library)
    except PoolError as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return 2
    keep_alive = math.inf if args.keep_alive is None else args.keep_alive
    pool = EnginePool(spec, engine_argv(args, parser), cap=args.model_pool, lookup=lookup,
                      api_key=args.api_key, pins=pins, keep_alive=keep_alive,
                      model_keep_alive=model_keep_alive)
    print(f"mlxbun: isolated serving of {spec.id} · engine pool of {pool.cap} · "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    try:  # (the engine refuses a config it cannot read; /fit then bills the dtype)
        kv_bits = parse_kv_quant(getattr(args, "kv_quant", None), spec.arg).bill_bits
    except ValueError:
        kv_bits = None
    from ..server.origin import CorsRules

    cors = CorsRules.from_values(args.cors or ())  # checked by startup.preflight already
    app = ParentApp(pool, library, api_key=args.api_key, kv_bits=kv_bits, policy=policy,
                    cors=cors)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                            lifespan="on", **uvicorn_settings(limits_from_args(args)))
    ParentServer(config, app).run()
    return app.exit_status
