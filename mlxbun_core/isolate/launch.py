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
import sys
from pathlib import Path

from ..library.cache import LibraryCache
from ..library.scan import scan
from ..models.paths import DEFAULT_MODEL_ID, model_id_for_dir
from ..models.resolve import ModelNotFound, library_match
from ..selection import chosen_model, report_selection_error
from .pool import EnginePool, ModelSpec

log = logging.getLogger("mlxbun.isolate")

# parent-only flags, plus the API key: children get it in their environment, where other
# local users cannot read it (a command line is visible to everyone in ps)
PARENT_ONLY = {"isolate", "model_pool", "host", "port", "unix", "model", "query", "positional",
               "help", "api_key"}


def engine_argv(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The serve flags the operator set (non-default), minus the parent-only ones."""
    serve = _subparser(parser, "serve")
    out = []
    for action in serve._actions:
        if not action.option_strings or action.dest in PARENT_ONLY:
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


def run_parent(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import uvicorn

    from ..kvquant import parse as parse_kv_quant
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

    pool = EnginePool(spec, engine_argv(args, parser), cap=args.model_pool, lookup=lookup,
                      api_key=args.api_key)
    print(f"mlxbun: isolated serving of {spec.id} · engine pool of {pool.cap} · "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    kv_bits = parse_kv_quant(getattr(args, "kv_quant", None)).bits
    app = ParentApp(pool, library, api_key=args.api_key, kv_bits=kv_bits)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                            lifespan="on")
    ParentServer(config, app).run()
    return 0
