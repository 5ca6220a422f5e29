"""``mlxbun serve --distributed``: one model across every rank of an ``mlx.launch`` group.

Every rank runs this same command. Each joins the ``mx.distributed`` group, refuses
what a distributed serve cannot do, and loads only its shard of the model through the
claiming family's ``load_model`` (``LoadOptions.shard``). Rank 0 then builds the usual
engine around a :class:`~mlxbun_core.distributed.lockstep.LockstepModel` and serves
HTTP; every other rank follows rank 0's forward passes until told to stop
(:mod:`mlxbun_core.distributed`). A rank that is lost makes rank 0 answer 503 and exit
(the watchdog); a drain on rank 0 (SIGTERM, SIGINT) ends with a stop to every rank.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from .distributed import DistributedGroup
    from .distributed.lockstep import LockstepModel
    from .distributed.watchdog import Watchdog
    from .engine.core import Engine
    from .engine.speculate import SpecConfig
    from .engine.worker import ModelWorker
    from .model import LoadedModel, LoadOptions

log = logging.getLogger("mlxbun.distributed")

# what a distributed serve refuses at start-up, and why (docs/distributed.md)
REFUSED = {
    "isolate": "--isolate (the engine must live in the rank-0 process)",
    "adapter": "LoRA adapters (--adapter)",
    "draft_model": "a draft model (--draft-model)",
    "embedding": "embedding models (--embedding)",
    "ssd_cache": "the SSD prompt-cache tier (--ssd-cache: a rank holds only its shard of "
                 "the KV)",
}


def refusal(args: argparse.Namespace) -> str | None:
    """What in ``args`` a distributed serve cannot do (None: nothing)."""
    for flag, what in REFUSED.items():
        if getattr(args, flag, None):
            return f"{what} cannot be used with --distributed"
    if getattr(args, "kv_quant", "off") not in ("off", None):
        return "--kv-quant cannot be used with --distributed (the KV scheme swap is not mirrored)"
    if getattr(args, "draft_kind", None) == "mtp" or getattr(args, "mtp", None) == "on":
        return ("--draft-kind mtp (--mtp on) cannot be used with --distributed (the MTP head "
                "runs the model's layers outside its call, where the other ranks cannot "
                "follow)")
    if getattr(args, "model_pool", 1) != 1:
        return "--model-pool cannot be used with --distributed"
    return None


def serve_distributed(args: argparse.Namespace) -> int:
    """The whole life of one rank; rank 0 never returns (it exits after serving)."""
    from .backend import keep_compiled_kernels
    from .distributed import init_group
    from .models.paths import mlxbun_home

    keep_compiled_kernels(mlxbun_home())  # (each rank compiles its own kernels: keep them too)
    problem = refusal(args)
    try:
        group = init_group(args.distributed_backend, args.pipeline)
    except (RuntimeError, ValueError) as exc:
        print(f"mlxbun: {exc}", file=sys.stderr)
        return 2
    if problem:  # every rank parsed the same flags: every rank stops here
        if group.rank == 0:
            print(f"mlxbun: {problem}", file=sys.stderr)
        return 2
    if group.rank != 0:
        return run_follower(args, group)
    return run_leader(args, group)


def load_options(args: argparse.Namespace, group: DistributedGroup) -> LoadOptions:
    from .library.scan import scan
    from .model import LoadOptions, ShardPlan

    return LoadOptions(library=scan, shard=ShardPlan(group.group, group.pipeline))


def load_shard(name: str | None, options: LoadOptions, group: DistributedGroup) -> LoadedModel:
    """This rank's shard of the chosen model, on the calling thread (the thread that will
    run its forward passes); then every rank meets (a slow loader is waited for)."""
    import mlx.core as mx

    from . import loader
    from .distributed import mirror

    model = loader.load(name, options, progress=group.rank == 0)
    plan = options.shard
    assert plan is not None
    mode = plan.applied(model.model)
    if mode is None:  # the plugin loaded it whole
        log.warning("plugin %s returned %s unsharded: sharding it now (every rank read all "
                    "of its weights)", model.plugin, model.id)
        mode = plan.apply(model.model)
        mx.eval(model.model.parameters())
    group.mode = mode
    mirror.install(recording=group.rank == 0, model=model.model)
    if group.mode == "pipeline":  # tensor parallel: every rank has every layer
        check_same_caches(model.model, group)
    mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group.group, stream=mx.cpu))
    return model


def check_same_caches(module: Any, group: DistributedGroup) -> None:
    """Every rank must make the same number of per-layer caches, all rewindable or none
    (rank 0 decides alone when to trim), each layer paged or recurrent alike (followers
    replay rank 0's batch layer by layer): pipeline stages of a hybrid model may not."""
    import zlib

    import mlx.core as mx
    import numpy as np

    from . import cache_ops
    from .engine.batch.layout import layout
    from .engine.prompt_cache import trimmable

    with mirror_quiet():
        caches = cache_ops.make(module)
        slots = layout(module)
    kinds = repr(None if slots is None else [(s.kind, s.parts) for s in slots])
    mine = mx.array([len(caches), int(trimmable(caches)), zlib.crc32(kinds.encode()) >> 1])
    every = mx.distributed.all_gather(mine[None], group=group.group)
    rows = [tuple(row) for row in np.array(every).tolist()]
    if len(set(rows)) > 1:
        raise RuntimeError(f"the ranks' shards keep different caches (layers, rewindable, "
                           f"kinds): {rows}; use another number of ranks or drop --pipeline")


def mirror_quiet() -> Any:
    from .distributed.mirror import RECORDER

    return RECORDER.quiet()


def run_follower(args: argparse.Namespace, group: DistributedGroup) -> int:
    """A follower rank: load, then mirror rank 0 until it stops (0) or is lost (1)."""
    from .distributed.channel import Channel
    from .distributed.follower import follow
    from .selection import chosen_model

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    try:
        model = load_shard(chosen_model(args), load_options(args, group), group)
        follow(model.model, Channel(group.group))
    except Exception as exc:
        print(f"mlxbun: rank {group.rank}: {type(exc).__name__}: {exc}", file=sys.stderr,
              flush=True)
        return 1
    return 0


def run_leader(args: argparse.Namespace, group: DistributedGroup) -> int:
    """Rank 0: the usual engine and app around the lockstep model."""
    from .distributed.channel import Channel
    from .distributed.lockstep import LockstepModel
    from .distributed.watchdog import Watchdog
    from .engine.worker import ModelWorker
    from .selection import chosen_model
    from .startup import (
        StartFailed,
        configure_media,
        configure_run,
        lookup_config,
        preflight,
        serve_forever,
    )

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    sock, problem = preflight(args)
    if problem:
        print(f"mlxbun: {problem}", file=sys.stderr)
        return 2
    try:
        speculation = lookup_config(args)  # --draft-kind ngram: drafts ride in the batch
    except StartFailed as exc:
        return exc.status
    configure_media(args)
    configure_run(args)
    worker = ModelWorker()
    try:
        name = chosen_model(args)
        model = worker.run_sync(lambda: load_shard(name, load_options(args, group), group))
    except Exception as exc:
        print(f"mlxbun: could not load {name or 'the default model'} across "
              f"{group.size} ranks: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    lockstep = LockstepModel(model.model, Channel(group.group))
    engine = leader_engine(args, group, model, lockstep, worker, speculation)
    watchdog = Watchdog(group, lockstep.ping, engine, timeout=args.distributed_timeout).start()
    print(f"mlxbun: distributed over {group.size} ranks ({group.backend}, {group.mode} "
          "parallel)", flush=True)

    def on_app(app: Any) -> None:
        app.state.stats_providers["distributed"] = group.describe
        app.state.health_providers["distributed"] = group.describe

    on_exit = stop_group_on_close(engine, lockstep, watchdog, args.distributed_timeout)
    serve_forever(args, engine, sock, on_app=on_app, on_exit=on_exit)


def leader_engine(args: argparse.Namespace, group: DistributedGroup, model: LoadedModel,
                  lockstep: LockstepModel, worker: ModelWorker,
                  speculation: SpecConfig | None = None) -> Engine:
    """The serve flags' engine around ``lockstep`` (it replaces the loaded shard in
    ``model``), billed for this rank's share, with prompt-lookup ``speculation`` (no MTP
    head: it is refused); mounting an adapter is refused."""
    from .engine.core import Engine
    from .library.ranks import rank_config
    from .startup import SAMPLING_FLAGS  # the serve flags of request_fields

    model.model = lockstep
    # admission bills this rank's KV (its weights are already its shard's)
    model.config = rank_config(model.config, group.size, group.mode)
    model.extras["ranks"] = group.size  # the default batch widens (fit.batch_plan)
    defaults = {k: getattr(args, k) for k in SAMPLING_FLAGS if getattr(args, k) is not None}
    engine = Engine(model, worker=worker, defaults=defaults, max_tokens=args.max_tokens or None,
                    speculation=speculation, batch=args.batch,
                    prompt_cache_bytes=int(args.prompt_cache * (1 << 30)),
                    memory_budget_bytes=int(args.memory_budget * 1e9)
                    if args.memory_budget else None)
    refuse_adapters(engine)
    return engine


def stop_group_on_close(engine: Engine, lockstep: LockstepModel, watchdog: Watchdog,
                        timeout: float) -> Callable[[int], int]:
    """Make ``engine.close`` stop every follower first; return the serve's ``on_exit``
    (the exit status: the watchdog's when a rank was lost, 1 when the stop failed). After
    a device fault (rank 0's engine lost its device, or ran out of memory mid-pass) no
    stop is sent: the collectives may be out of step, and the other ranks end when rank
    0's exit breaks the group."""
    close = engine.close
    stopped: list[Exception | None] = []

    def close_all() -> None:
        """The app stops (after a drain): every follower ends its loop and exits 0, then
        the worker stops."""
        if not watchdog.broken and not engine.worker.broken and not stopped:
            try:
                def stop() -> None:  # on the worker, after whatever is queued there
                    lockstep.stop()
                    watchdog.retire()  # only now: a stuck stop must still be timed out

                engine.worker.run_sync(stop, timeout=timeout + 5)
                stopped.append(None)
            except TimeoutError:  # the worker is stuck in a collective: a rank is gone
                from .distributed.watchdog import EXIT_STATUS

                print("mlxbun: the other ranks did not stop; exiting", file=sys.stderr,
                      flush=True)
                os._exit(EXIT_STATUS)
            except Exception as exc:
                print(f"mlxbun: stopping the other ranks: {exc}", file=sys.stderr)
                stopped.append(exc)
        close()

    setattr(engine, "close", close_all)  # noqa: B010  # this engine's own shutdown

    def on_exit(status: int) -> int:
        from .distributed.watchdog import EXIT_STATUS

        if watchdog.broken:
            return EXIT_STATUS
        if engine.worker.broken:  # (the drain's DEVICE_FAULT_EXIT)
            return status
        if not stopped:  # the app never stopped cleanly: stop the group now
            close_all()
        return status or (1 if stopped and stopped[0] is not None else 0)

    return on_exit


def refuse_adapters(engine: Any) -> None:
    """Mounting a LoRA adapter is a 400 under --distributed (the adapter would have to be
    sharded like its layer on every rank; not supported)."""
    from .errors import BadRequest

    async def refuse(*_: Any, **__: Any) -> Any:
        raise BadRequest("LoRA adapters cannot be mounted on a --distributed serve",
                         param="id")

    setattr(engine.adapters, "mount_async", refuse)  # noqa: B010  # an instance's own refusal
