"""Rank 0 to every rank over the group's own collectives: descriptors and input arrays.

A broadcast is an ``all_sum`` where rank 0 contributes the data and every other rank
zeros (the pattern ``mlx_lm.server`` uses to share its requests). A descriptor travels
in one fixed-size frame when it is small (every decode step), in a second one sized by
the first when it is not. Everything goes on one stream, created on the thread that
uses the channel, so every rank runs the same collectives in the same order; rank 0
never waits for a send (its collectives are queued with the forward pass they belong to).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

FRAME = 1024  # bytes: one collective for a descriptor up to FRAME - 4 bytes


class Channel:
    def __init__(self, group: Any):
        self.group = group
        self.rank = int(group.rank())
        self._stream: Any = None

    @property
    def stream(self) -> Any:
        """The channel's stream (made on first use, on the calling thread); every forward
        pass of a distributed serve runs on it too."""
        if self._stream is None:
            import mlx.core as mx

            self._stream = mx.new_stream(mx.default_device())
        return self._stream

    def _all_sum(self, x: Any) -> Any:
        import mlx.core as mx

        return mx.distributed.all_sum(x, group=self.group, stream=self.stream)

    # -- rank 0 -----------------------------------------------------------------------
    def send(self, obj: Any) -> None:
        """Queue ``obj`` (picklable) to every rank without waiting."""
        import mlx.core as mx
        import numpy as np

        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        head = struct.pack("<I", len(data)) + data[:FRAME - 4]
        frame = np.zeros(FRAME, dtype=np.uint8)
        frame[:len(head)] = np.frombuffer(head, dtype=np.uint8)
        # one evaluation each: MLX does not promise the order of independent arrays
        # evaluated together, and the other ranks take the second frame second
        mx.async_eval(self._all_sum(mx.array(frame)))
        if len(data) > FRAME - 4:
            mx.async_eval(self._all_sum(mx.array(np.frombuffer(data[FRAME - 4:], np.uint8))))

    def share(self, arrays: list[Any]) -> list[Any]:
        """``arrays`` as every rank receives them, each all_sum queued in list order (one
        evaluation each, as :meth:`send` does) whatever reads them later."""
        import mlx.core as mx

        shared = []
        for a in arrays:
            shared.append(self._all_sum(a))
            mx.async_eval(shared[-1])
        return shared

    # -- the other ranks -------------------------------------------------------------
    def recv(self) -> Any:
        """The next descriptor from rank 0 (blocks; a lost peer raises ``RuntimeError``)."""
        import mlx.core as mx
        import numpy as np

        frame = self._all_sum(mx.zeros(FRAME, dtype=mx.uint8))
        mx.eval(frame)
        raw = bytes(np.array(frame))
        (n,) = struct.unpack("<I", raw[:4])
        data = raw[4:4 + n]
        if n > FRAME - 4:
            rest = self._all_sum(mx.zeros(n - (FRAME - 4), dtype=mx.uint8))
            mx.eval(rest)
            data += bytes(np.array(rest))
        return pickle.loads(data)

    def receive(self, specs: list[tuple[tuple[int, ...], str]]) -> list[Any]:
        """The arrays rank 0 shares next, from their ``(shape, dtype name)``."""
        import mlx.core as mx

        return self.share([mx.zeros(shape, dtype=getattr(mx, dtype)) for shape, dtype in specs])
