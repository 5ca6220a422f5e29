"""Rank 0's side of a distributed forward pass: the model every lane calls.

:class:`LockstepModel` stands in for the loaded ``nn.Module`` (every attribute reads
through to it, so ``make_cache``, ``layers``, ``parameters`` and the rest are the
model's own). Each call, before the forward pass itself, sends every other rank a
descriptor (what changed the caches since the last one: the serial lane's mlx-lm cache
operations (``mirror.py``) and the batch's journal (``engine/batch/journal.py``); then
what this call runs on: a batch pass's plan, or the serial lane's cache objects; and
the shapes and dtypes of its array arguments), then shares the arrays
(lazily: the tokens of a decode step are usually still being sampled), then runs the
forward pass on the channel's stream and queues its evaluation, so that rank 0 runs
every collective of every forward pass, in order, even the ones whose output the
caller never reads (a prefill chunk evaluates only the cache). Nothing here waits: the
pipelined decode loops keep their overlap.

:meth:`LockstepModel.ping` is a round trip through every rank (the watchdog's probe);
:meth:`LockstepModel.stop` ends the followers' loops.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..engine.batch.journal import Journal
from .channel import Channel
from .mirror import RECORDER


def dtype_name(a: Any) -> str:
    return str(a.dtype).rpartition(".")[2]


class LockstepModel:
    def __init__(self, module: Any, channel: Channel):
        object.__setattr__(self, "_module", module)
        object.__setattr__(self, "_channel", channel)
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "calls", 0)
        object.__setattr__(self, "stopped", False)  # the followers were told to stop
        # the batch lane's record of its pool and states (it finds it here)
        object.__setattr__(self, "journal", Journal())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._module, name, value)

    def __call__(self, inputs: Any, cache: Any = None, **kwargs: Any) -> Any:
        import mlx.core as mx

        if self.stopped:
            raise RuntimeError("the distributed group was stopped")

        names = [k for k, v in kwargs.items() if isinstance(v, mx.array)]
        plain = {k: v for k, v in kwargs.items() if k not in names}
        arrays = [inputs, *(kwargs[k] for k in names)]
        plan = getattr(cache, "plan", None)  # a batch pass (journal.Pass)
        with self._lock, mx.stream(self._channel.stream):
            target = (("pass", plan) if plan is not None else
                      ("caches", None if cache is None else RECORDER.encode(cache)))
            desc = ("fwd", RECORDER.take(), self.journal.take(), target,
                    [(tuple(a.shape), dtype_name(a)) for a in arrays], names, plain)
            self._channel.send(desc)
            shared = self._channel.share(arrays)
            # queued now: a pipeline stage's forward may not read its inputs at all (it
            # receives hidden states instead) and must not run its own collectives first
            mx.async_eval(shared)
            with RECORDER.quiet():
                out = self._module(shared[0], cache=cache, **plain,
                                   **dict(zip(names, shared[1:], strict=True)))
            mx.async_eval(out)
            object.__setattr__(self, "calls", self.calls + 1)
        return out

    def ping(self) -> float:
        """A round trip through every rank (after the work already queued); its time in
        seconds. A lost rank raises ``RuntimeError`` (or never returns: the watchdog
        times it out)."""
        import mlx.core as mx

        if self.stopped:
            raise RuntimeError("the group was stopped")
        t0 = time.perf_counter()
        with self._lock, mx.stream(self._channel.stream):
            self._channel.send(("ping", RECORDER.take(), self.journal.take()))
            (count,) = self._channel.share([mx.ones(1, dtype=mx.int32)])
            got = int(count.item())
        if got != self._channel.group.size():
            raise RuntimeError(f"ping: {got} of {self._channel.group.size()} ranks answered")
        return time.perf_counter() - t0

    def stop(self) -> None:
        """End the followers' loops (a clean shutdown); waits until they have it."""
        import mlx.core as mx

        with self._lock, mx.stream(self._channel.stream):
            object.__setattr__(self, "stopped", True)
            self._channel.send(("stop",))
            (count,) = self._channel.share([mx.ones(1, dtype=mx.int32)])
            mx.eval(count)
