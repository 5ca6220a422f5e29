"""``mlxbun evals run [MODEL]``: score a local model on the built-in tasks
(:mod:`.evaltasks`) in-process, or on lm-evaluation-harness's tasks through a temporary
server (``--lm-eval``, :mod:`.lm_eval_run`); each task's score becomes a row of the eval
DB that ``mlxbun evals`` lists next to the bench runs."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from ..serve_flags import add_kv_quant_flag, add_selection_flags
from . import evaldb, evaltasks
from .measure import load_engine


def _task_list(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in evaltasks.TASKS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown task {', '.join(unknown) or '(none)'}; built-in tasks: "
            f"{', '.join(evaltasks.TASKS)} (lm-eval's: --lm-eval)")
    return names


def add_parser(evals: argparse.ArgumentParser) -> None:
    from .oneshot import verb_parser

    sub = evals.add_subparsers(dest="evals_verb", metavar="run")
    r = verb_parser(sub, "run", help="score a local model on the built-in tasks (or "
                                     "lm-eval's) and record the scores")
    r.add_argument("positional", nargs="?", default=None, metavar="model")
    add_selection_flags(r)
    r.add_argument("--tasks", type=_task_list, default=list(evaltasks.TASKS),
                   metavar="TASK[,TASK]",
                   help=f"built-in tasks to run ({','.join(evaltasks.TASKS)}; default all): "
                        "mc multiple choice by log-likelihood, gen exact-match answers, "
                        "json schema validity under the grammar, tools tool-call validity")
    add_kv_quant_flag(r, default="off")
    from .lm_eval_run import add_flags
    add_flags(r)
    r.add_argument("--json", action="store_true", help="each task's row as a JSON line")
    r.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    from ..errors import APIError
    from ..kvquant.probe import KVQuantUnavailable
    from ..models.paths import mlxbun_home
    from ..models.resolve import ModelNotFound
    from ..selection import chosen_model, report_selection_error, resolve
    from . import lm_eval_run

    if args.lm_eval is not None and (refused := lm_eval_run.missing(args)) is not None:
        print(f"mlxbun evals run: {refused}", file=sys.stderr)
        return 2
    try:
        resolved = resolve(chosen_model(args), progress=False)
    except ModelNotFound as exc:
        return report_selection_error(exc)
    try:
        if args.lm_eval is not None:
            rows = lm_eval_run.run(str(resolved.path), resolved.model_id, args)
        else:
            rows = asyncio.run(_builtin(str(resolved.path), resolved.model_id, args))
    except KVQuantUnavailable as exc:
        print(f"mlxbun evals run: {exc}", file=sys.stderr)
        return 2
    except (APIError, lm_eval_run.LmEvalFailed) as exc:
        print(f"mlxbun evals run: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 1
    for row in rows:
        evaldb.record_score(mlxbun_home(), row)
        print(json.dumps(row) if args.json else evaldb.summary(row))
    return 0


async def _builtin(path: str, model_id: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    engine = load_engine(path, model_id, args.kv_quant)
    try:
        results = [await evaltasks.run_task(engine, name) for name in args.tasks]
    finally:
        engine.close()
    return [evaldb.score_row(model_id, args.kv_quant, "mlxbun", r.task, r.metric, r.score, r.n,
                      r.seconds, {**r.extra, "items": r.items}) for r in results]
