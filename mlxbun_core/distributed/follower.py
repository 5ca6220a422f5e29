"""A follower rank's whole life after loading: mirror rank 0's forward passes.

A follower runs no engine, no HTTP and no sampling: it receives each descriptor,
applies what it carries to its own caches (the batch's journal to its block pool and
recurrent states, ``engine/batch/replay.py``; the serial lane's cache operations to its
mlx-lm caches, :mod:`.mirror`), receives the input arrays and runs the same forward pass
on its shard (a batch pass over its own pool, from the pass's plan), which takes part
in the same collectives as rank 0's. It ends on rank 0's stop (exit 0) or when the group
breaks (a collective raises: rank 0 is gone; exit non-zero).
"""

from __future__ import annotations

import logging
from typing import Any

from ..engine import attention_route
from ..engine.batch.replay import Replica
from .channel import Channel
from .mirror import RECORDER, Replayer

log = logging.getLogger("mlxbun.distributed")


class Follower:
    """A follower's caches (the batch's block pool and recurrent states, the serial
    lane's mlx-lm caches) and the forward passes it runs on them."""

    def __init__(self, module: Any):
        self.module = module
        self.replayer = Replayer()  # the serial lane's caches
        self.replica = Replica(module)  # the batch's pool and states
        self.steps = 0

    def apply(self, desc: tuple[Any, ...]) -> None:
        """What changed rank 0's caches since its last descriptor (``desc``)."""
        self.replayer.replay(desc[1])
        self.replica.apply(desc[2])

    def forward(self, desc: tuple[Any, ...], arrays: list[Any]) -> Any:
        """The forward pass a ``"fwd"`` descriptor describes, on the ``arrays`` rank 0
        shared; evaluated, with the caches it wrote."""
        import mlx.core as mx

        _, _, _, (how, what), _, names, plain = desc
        cache = self.replica.caches(what) if how == "pass" else self.replayer.caches(what)
        with RECORDER.quiet():
            out = self.module(arrays[0], cache=cache, **plain,
                              **dict(zip(names, arrays[1:], strict=True)))
        mx.eval(out, self.replica.arrays(what) if how == "pass" else [])
        self.steps += 1
        if self.steps % 256 == 0:
            mx.clear_cache()
        return out


def follow(module: Any, channel: Channel) -> None:
    """Serve rank 0's forward passes until it says stop (returns) or the group breaks
    (raises)."""
    import mlx.core as mx

    attention_route.install()  # the same attention kernels as rank 0's engine
    me = Follower(module)
    with mx.stream(channel.stream):
        while True:
            desc = channel.recv()
            kind = desc[0]
            if kind == "stop":
                mx.eval(channel.share([mx.ones(1, dtype=mx.int32)]))
                log.info("rank %d: stop after %d forward passes", channel.rank, me.steps)
                return
            me.apply(desc)
            if kind == "ping":
                mx.eval(channel.share([mx.ones(1, dtype=mx.int32)]))
                continue
            arrays = channel.receive(desc[4])
            mx.async_eval(arrays)  # in rank 0's order, whatever this stage's forward reads
            me.forward(desc, arrays)
