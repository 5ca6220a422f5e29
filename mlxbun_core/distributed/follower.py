"""A follower rank's whole life after loading: mirror rank 0's forward passes.

A follower runs no engine, no HTTP and no sampling: it receives each descriptor,
replays the cache operations it carries on its own cache objects (:mod:`.mirror`),
receives the input arrays and runs the same forward pass on its shard, which takes part
in the same collectives as rank 0's. It ends on rank 0's stop (exit 0) or when the group
breaks (a collective raises: rank 0 is gone; exit non-zero).
"""

from __future__ import annotations

import logging
from typing import Any

from ..engine import attention_route
from .channel import Channel
from .mirror import RECORDER, Replayer

log = logging.getLogger("mlxbun.distributed")


def follow(module: Any, channel: Channel) -> None:
    """Serve rank 0's forward passes until it says stop (returns) or the group breaks
    (raises)."""
    import mlx.core as mx

    attention_route.install()  # the same attention kernels as rank 0's engine
    replayer = Replayer()
    steps = 0
    with mx.stream(channel.stream):
        while True:
            desc = channel.recv()
            kind = desc[0]
            if kind == "stop":
                mx.eval(channel.share([mx.ones(1, dtype=mx.int32)]))
                log.info("rank %d: stop after %d forward passes", channel.rank, steps)
                return
            replayer.replay(desc[1])
            if kind == "ping":
                mx.eval(channel.share([mx.ones(1, dtype=mx.int32)]))
                continue
            _, _, cache_enc, specs, names, plain = desc
            arrays = channel.receive(specs)
            mx.async_eval(arrays)  # in rank 0's order, whatever this stage's forward reads
            cache = replayer.caches(cache_enc)
            with RECORDER.quiet():
                out = module(arrays[0], cache=cache, **plain,
                             **dict(zip(names, arrays[1:], strict=True)))
            mx.eval(out)
            steps += 1
            if steps % 256 == 0:
                mx.clear_cache()
