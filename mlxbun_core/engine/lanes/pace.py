"""Prefill chunks sized from measured speed, so a cancel lands within about one chunk.

A lane checks its jobs' cancel flags between steps, and a step reads at most one
prefill chunk. A fixed chunk of mlx-lm's 2,048 tokens takes ~0.1 s on an H200 but
minutes on a slow CPU (the embedded SmolLM2 prefilled at ~10 tok/s with the reference
BLAS): a Stop, or a client gone, then waited for the whole chunk. So every lane asks
one shared :class:`PrefillPacer` how many tokens to read next and tells it how long
that took. The pacer keeps a smoothed tokens-per-second rate and answers the lane's
own limit when that fits ``TARGET_S``, else the largest power of two that does (a
chunk then takes between half of it and all of it; powers of two keep the set of
query lengths small, and MLX's first forward pass at a new length costs extra on CUDA).

The engine calibrates it at start-up (``calibrate``), so the very first request is
paced too and the SSD tier's restore-vs-recompute check has a rate in a fresh process:
forward passes of 8, 32, 128 then 512 tokens on a scratch cache, stopping at the first
that takes ``CALIBRATION_S`` (a slow CPU stops after one or two; a GPU reaches 512 tokens
in milliseconds, where the fixed per-pass costs no longer hide its rate). Short passes
(and any short chunk) understate a fast device (fixed per-pass costs, first-use kernel
compilation), so a faster reading replaces the rate at once while a slower one is
smoothed in; a chunk under half the size asked for (a prompt's tail, a cache hit's few
new tokens) is not measured at all. A rate kept from real prompts of an earlier run
(``seed``) replaces the calibration's.
"""

from __future__ import annotations

import logging
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ...library.fit import PREFILL_CHUNK

if TYPE_CHECKING:
    import mlx.nn as nn

log = logging.getLogger("mlxbun.engine")

TARGET_S = 0.8  # longest a chunk should take
FIRST_CHUNK = 16  # before anything is measured
MIN_CHUNK = 1  # a backend at a few tok/s (reference BLAS) still answers a cancel in time
MAX_CHUNK = PREFILL_CHUNK  # what the memory plan bills one prompt's prefill scratch for
CALIBRATION_TOKENS = 8  # a 135M model on a reference-BLAS CPU reads ~2-10 tok/s
CALIBRATION_MAX = 512  # the longest calibration pass (x4 from CALIBRATION_TOKENS)
CALIBRATION_S = 0.1  # a pass this long measures the rate well enough: stop there
SMOOTHING = 0.5  # weight of the newest measurement


class PrefillPacer:
    """Tokens per prefill chunk for the worker thread's lanes (one per engine)."""

    def __init__(self, target_s: float = TARGET_S, lo: int = MIN_CHUNK):
        self.target_s, self.lo = target_s, lo
        self.rate: float | None = None  # prompt tokens per second, smoothed
        self.chunks = 0  # chunks measured
        self.calibration_passes = 0  # of them, start-up calibration and seeds

    def chunk(self, limit: int = MAX_CHUNK) -> int:
        """Prompt tokens to read in the next chunk (every row of the chunk together),
        at most ``limit``."""
        want = FIRST_CHUNK if self.rate is None else self.rate * self.target_s
        if want >= limit:
            return max(1, limit)
        size = self.lo
        while size * 2 <= want:
            size *= 2
        return min(size, max(1, limit))

    def record(self, tokens: int, seconds: float, asked: int = 0) -> None:
        """A chunk of ``tokens`` prompt tokens (of ``asked``) took ``seconds``."""
        if seconds <= 0 or tokens <= 0 or tokens * 2 < asked:
            return
        rate = tokens / seconds
        if self.rate is None or rate > self.rate:
            self.rate = rate  # short or first chunks understate: a faster reading is real
        else:
            self.rate = SMOOTHING * rate + (1 - SMOOTHING) * self.rate
        self.chunks += 1

    def timed(self, asked: int = 0) -> _Timer:
        """``with pacer.timed(asked) as t: ...; t.tokens = n`` records the block's time
        (``asked``: the chunk size the lane asked for)."""
        return _Timer(self, asked)

    def calibrate(self, model: nn.Module) -> None:
        """Forward passes of growing length on scratch caches until one takes
        ``CALIBRATION_S`` (the worker thread, at start-up)."""
        import mlx.core as mx

        from ... import cache_ops

        tokens = CALIBRATION_TOKENS
        try:
            while tokens <= CALIBRATION_MAX:
                cache = cache_ops.make(model)
                t0 = time.perf_counter()
                with self.timed() as t:
                    model(mx.arange(tokens)[None], cache=cache)
                    mx.eval([c.state for c in cache])
                    t.tokens = tokens
                if time.perf_counter() - t0 >= CALIBRATION_S:
                    break
                tokens *= 4
        except Exception as exc:  # not a causal LM we can call plainly: stay at FIRST_CHUNK
            log.debug("prefill calibration skipped: %s", exc)
        self.calibration_passes = self.chunks

    def seed(self, rate: float) -> None:
        """A prefill rate measured on real prompts of this model in an earlier run on this
        device: it replaces the calibration's (short passes on an empty cache overstate a
        GPU's rate at long contexts, and understate a CPU's), until real chunks come."""
        if rate > 0:
            self.rate = rate

    @property
    def measured(self) -> bool:
        """Whether real prompt chunks (not calibration) have been read since start."""
        return self.chunks > self.calibration_passes

    def stats(self) -> dict[str, Any]:
        return {"target_s": self.target_s, "chunk_tokens": self.chunk(),
                "prefill_tps": round(self.rate, 1) if self.rate else None,
                "chunks_measured": self.chunks}


class FixedChunk(PrefillPacer):
    """Always ``size`` tokens, nothing measured (``--prefill-step``-style pinning, tests)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def chunk(self, limit: int = MAX_CHUNK) -> int:
        return max(1, min(self.size, limit))

    def record(self, tokens: int, seconds: float, asked: int = 0) -> None:
        pass

    def calibrate(self, model: nn.Module) -> None:
        pass


class _Timer:
    __slots__ = ("pacer", "asked", "tokens", "_t0")

    def __init__(self, pacer: PrefillPacer, asked: int):
        self.pacer, self.asked, self.tokens, self._t0 = pacer, asked, 0, 0.0

    def __enter__(self) -> _Timer:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.pacer.record(self.tokens, time.perf_counter() - self._t0, self.asked)
