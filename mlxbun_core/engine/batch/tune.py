"""Which decode forward a batch runs: timed on this machine once, at start.

The ways give the model's logits (each passed a probe); they differ in the host work a
step takes to build its graph and hand it to MLX, which on a GPU decides the step (the
card waited 0.5 ms of a 12.75 ms step at 32 rows on an H100: ``bench/NOTES.md``), and
which no single answer settles for every host, backend and model:

- ``lean``: the model's own modules on 2-D activations (``lean.py``), the default;
- ``fused``: the same, each layer's gate and up weights joined in one buffer and one
  matmul (36 kernels fewer a step at 36 layers, 72 slices more);
- ``model``: mlx-lm's own call.

Where the device is a GPU, :func:`choose` runs a scratch batch's decode steps each way,
alternating over rounds, and keeps the fastest unless lean is within :data:`MARGIN` of
it. On the CPU a step is its arithmetic, the ways tie, and lean is kept untimed.
``MLXBUN_DECODE_STEP`` (``lean``, ``fused``, ``model``) picks one outright.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import mlx.core as mx

from ...backend import backend
from ...runconfig import current
from .direct import TOLERANCE, decode_both_ways
from .executor import Batch
from .lean import LeanDecode
from .lean import for_solo as lean_for_solo
from .pool import BlockPool

log = logging.getLogger("mlxbun.engine")

MARGIN = 0.03  # how much faster another way must be than lean to be kept instead
ROWS = 32  # the scratch batch's rows (the step a loaded server runs)
PROMPT = 8  # each scratch row's prompt tokens
STEPS = 6  # decode steps timed a way a round (after one that builds its first graph)
ROUNDS = 3

Timing = Callable[[Batch, list[str], int], dict[str, float]]


@dataclass(frozen=True)
class Verdict:
    """The way a batch's decode steps go, and why: ``timed`` (``ms``: the median step
    of each way tried), ``set`` (``MLXBUN_DECODE_STEP``) or ``cpu``."""

    way: str
    why: str
    ms: dict[str, float] = field(default_factory=dict)

    def stats(self) -> dict[str, Any]:
        return {"way": self.way, "why": self.why, "ms": self.ms}


def choose(batch: Batch, rows: int = ROWS, setting: str | None = None,
           gpu: bool | None = None, timing: Timing | None = None) -> Verdict | None:
    """Decide and :func:`apply` the way of ``batch`` (whose lean probe has run), or None
    where it has no lean step (the model's call it is). ``rows``: the scratch batch's
    (at most the lane's cap); ``setting``: ``auto`` or a way (None: the run
    configuration's); ``gpu``: whether to time (None: the default device's kind);
    ``timing``: how the ways are timed (:func:`time_ways`)."""
    lean = batch.lean
    if not isinstance(lean, LeanDecode):
        return None

    def timed() -> dict[str, float]:
        ways = ["lean", "model"] + (["fused"] if fusable(batch, lean) else [])
        ms = (timing or time_ways)(batch, ways, rows)
        mx.clear_cache()  # (the scratch rows' blocks)
        return ms

    verdict = decide(setting, gpu, timed)
    if verdict == Verdict("fused", "set") and not fusable(batch, lean):
        verdict = Verdict("lean", "set")  # (no plain gate and up, or other logits)
    apply(batch, verdict.way, lean)
    log.info("decode steps: %s (%s)", verdict.way, said(verdict, f" a step at {rows} rows"))
    return verdict


def for_solo(model: Any, setting: str | None = None, gpu: bool | None = None,
             timing: Callable[[Any, LeanDecode], dict[str, float]] | None = None
             ) -> tuple[LeanDecode | None, Verdict | None]:
    """A lone stream's one-token step (``lean.for_solo``'s, where its probe passed) and
    the way it goes, decided as :func:`choose` decides a batch's between lean and the
    model's call (a lone stream has no fused way: the batch's lean step owns the joined
    weights). None and None where the model has no lean step."""
    made = lean_for_solo(model)
    if made is None:
        return None, None
    verdict = decide(setting, gpu, lambda: (timing or time_solo)(model, made))
    if verdict.way == "fused":
        verdict = Verdict("lean", verdict.why)
    log.info("lone streams' decode steps: %s (%s)", verdict.way, said(verdict, " a step"))
    return (None if verdict.way == "model" else made), verdict


def decide(setting: str | None, gpu: bool | None,
           timed: Callable[[], dict[str, float]]) -> Verdict:
    """``setting`` (None: the run configuration's) where it names a way; else lean on
    the CPU (``gpu``: None, the default device's kind), or the :func:`pick` of ``timed``."""
    setting = setting or current().engine.decode_step
    if setting != "auto":
        return Verdict(setting, "set")
    if not (gpu if gpu is not None else backend() != "cpu"):
        return Verdict("lean", "cpu")
    ms = timed()
    return Verdict(pick(ms), "timed", {w: round(v, 3) for w, v in ms.items()})


def said(verdict: Verdict, unit: str) -> str:
    """How ``verdict`` came about, for the start-up log."""
    if verdict.ms:
        return ", ".join(f"{w} {v:.2f} ms" for w, v in verdict.ms.items()) + unit
    return "MLXBUN_DECODE_STEP" if verdict.why == "set" else "on the CPU, untimed"


def time_solo(model: Any, made: LeanDecode) -> dict[str, float]:
    """Median ms a lone stream's one-token step takes each way (lean, the model's call),
    over mlx-lm's own caches, each step's token fed to the next as a lone stream runs."""
    from ... import cache_ops

    caches = {"lean": cache_ops.make(model), "model": cache_ops.make(model)}
    prompt = mx.array([[1 + (7 * i) % 97 for i in range(PROMPT)]])

    def forward(way: str, y: mx.array) -> mx.array:
        if way == "lean":
            return made(y, caches[way])
        return cast(mx.array, model(y, cache=caches[way]))

    laps: dict[str, list[float]] = {"lean": [], "model": []}
    for cache in caches.values():
        mx.eval(model(prompt, cache=cache))
    for r in range(ROUNDS):
        for way in (["lean", "model"] if r % 2 == 0 else ["model", "lean"]):
            y = mx.array([[5]])
            t = 0.0
            for step in range(STEPS * 2 + 1):
                if step == 1:  # (the first step built this way's graph)
                    mx.eval(y)
                    t = time.perf_counter()
                y = mx.argmax(forward(way, y)[:, -1:], axis=-1)
                mx.async_eval(y)
            mx.eval(y)
            laps[way].append((time.perf_counter() - t) / (STEPS * 2))
    return {w: 1e3 * statistics.median(v) for w, v in laps.items()}


def pick(ms: dict[str, float]) -> str:
    """The fastest way, unless lean is within :data:`MARGIN` of it."""
    best = min(ms, key=ms.__getitem__)
    return best if ms[best] < ms["lean"] * (1 - MARGIN) else "lean"


def apply(batch: Batch, way: str, lean: LeanDecode | None) -> None:
    """Set ``batch``'s decode forward to ``way`` (``lean``: the batch's lean step,
    whether it runs now or not; ``fused`` where its layers' gate and up are joined)."""
    if lean is None or way == "model":
        batch.lean = None
        return
    lean.fused = way == "fused" and lean.fuse_gate_up() > 0
    batch.lean = lean


def fusable(batch: Batch, lean: LeanDecode) -> bool:
    """Join the layers' gate and up weights (the model keeps views: no memory grows)
    and check that the fused step gives the model's logits on a scratch pass."""
    if not lean.fuse_gate_up():
        return False
    lean.fused = True
    try:
        error = decode_both_ways(batch, [(batch.direct, batch.forward), (batch.direct, lean)])
    except Exception as exc:  # (the separate matmuls stay)
        log.info("fused gate and up off (%s)", exc)
        error = None
    finally:
        lean.fused = False
    return error is not None and error <= TOLERANCE


def time_ways(batch: Batch, ways: list[str], rows: int = ROWS) -> dict[str, float]:
    """Median ms a decode step of ``rows`` scratch rows takes each way, steps pipelined
    as a lane runs them, the ways' order turning each round."""
    lean = batch.lean
    assert isinstance(lean, LeanDecode)
    size = batch.pool.block_size
    tokens = PROMPT + ROUNDS * len(ways) * (STEPS + 1) + 2
    scratch = Batch(batch.model, batch.layout.slots,
                    BlockPool(size, rows * -(-tokens // size) + 1))
    scratch.direct = batch.direct
    laps: dict[str, list[float]] = {w: [] for w in ways}
    try:
        for uid in range(rows):
            scratch.add(uid, [1 + (7 * uid + 3 * i) % 97 for i in range(PROMPT)])
        while scratch.prefilling:
            scratch.prefill({u: PROMPT for u in scratch.prefilling})
        for r in range(ROUNDS):
            for way in ways[r % len(ways):] + ways[:r % len(ways)]:
                apply(scratch, way, lean)
                scratch.decode()  # (this way's first graph, and the pipeline primed)
                mx.eval(scratch.next_tokens)
                t = time.perf_counter()
                for _ in range(STEPS):
                    scratch.decode()
                mx.eval(scratch.next_tokens)
                laps[way].append((time.perf_counter() - t) / STEPS)
    finally:
        scratch.close()
        lean.fused = False
    return {w: 1e3 * statistics.median(v) for w, v in laps.items()}
