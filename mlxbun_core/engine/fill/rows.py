"""Forced runs on the batch lane: rows with a run and rows without share one forward.

mlx-lm's ``GenerationBatch`` feeds one token per row per step. :class:`FillBatch`
replaces that step while any row has a fill session: each row's sampled token is read,
its grammar's forced run found, and every row is fed ``[token, *run]`` right-padded to
the longest run, in one ``(rows, width)`` forward. The padding lands in the KV past each
row's real tokens (causal attention keeps real queries off it); the cache's own
right-padding pass (``BatchKVCache.prepare``/``finalize``, what mlx-lm's batched prefill
uses) then rolls it into the row's left padding, where the mask hides it for good. Each
row samples from the logits at its own last real position.

Rows without a run pay ``width - 1`` padded positions of compute and a roll of their KV;
steps where no row has a run are mlx-lm's own step, unchanged. Only plain
``BatchKVCache`` layers can roll; other cache kinds (rotating windows, recurrent state,
quantized KV) keep one token per step.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, cast

import mlx.core as mx
from mlx_lm.generate import GenerationBatch
from mlx_lm.models.cache import BatchKVCache

if TYPE_CHECKING:
    from mlx_lm.generate import BatchGenerator

    from .forced import FillSession


# A shared fill step computes every row at the full width. On a GPU at decode batch sizes a
# step is bandwidth-bound, so a wider one costs about the same. On the CPU compute grows
# with the width and the plain rows pay for the padding: measured (bench/NOTES.md, 8 rows,
# tiny checkpoint) a mixed batch was 1.03x (JSON) and 0.63x (tool calls) with shared runs,
# the plain rows at 0.4x their tok/s. So the CPU keeps one token per step in the batch
# (fill still runs for a lone stream and on the serial lane, where it pays).
CPU_STEP_TOKENS = 0
GPU_STEP_TOKENS = 512


class FillBatch(GenerationBatch):
    """mlx-lm's generation batch with forced runs (``fills``: uid -> session; ``runs``:
    uid -> the run fed with that row's token in the last step)."""

    fills: dict[int, FillSession]
    runs: dict[int, list[int]]

    def _step(self) -> tuple[list[int], list[mx.array]]:
        self.runs = {}
        fills = [self.fills.get(uid) for uid in self.uids]
        if not any(fills) or not all(type(c) is BatchKVCache for c in self.prompt_cache):
            return super()._step()
        ids = cast("list[int]", self._next_tokens.tolist())  # the grammar reads them anyway
        cap = max(0, step_tokens() // len(ids) - 1)  # the longest run this step can carry
        runs = [f.after(t, cap) if f is not None else [] for f, t in zip(fills, ids)]
        if not any(runs):  # the matchers have the tokens: the processors skip them
            return super()._step()
        return self._step_runs(ids, runs)

    def _step_runs(self, ids: list[int],
                   runs: list[list[int]]) -> tuple[list[int], list[mx.array]]:
        """The step with every row fed ``[token, *run]`` (right-padded) in one forward."""
        self._current_tokens = self._next_tokens  # type: ignore[assignment]  # mlx-lm types it None
        self._current_logprobs = self._next_logprobs
        width = 1 + max(len(r) for r in runs)
        fed = [[t, *r] for t, r in zip(ids, runs)]
        grid = mx.array([row + row[-1:] * (width - len(row)) for row in fed])
        for c in self.prompt_cache:
            c.prepare(right_padding=[width - len(row) for row in fed])
        logits = self.model(grid, cache=self.prompt_cache)
        for c in self.prompt_cache:
            c.finalize()
        last = mx.array([len(row) - 1 for row in fed])
        logits = logits[mx.arange(len(fed)), last]
        logits, context = self._processed(logits, fed)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        self._next_tokens = self._sample(logprobs)
        self._next_logprobs = list(logprobs)
        mx.async_eval(self._next_tokens, self._next_logprobs, context)
        mx.eval(self._current_logprobs)
        for i, (uid, row) in enumerate(zip(self.uids, fed)):
            self.tokens[i].extend(row)
            self._num_tokens[i] += len(row) - 1
            if len(row) > 1:
                self.runs[uid] = row[1:]
        return ids, self._current_logprobs

    def _processed(self, logits: mx.array,
                   fed: list[list[int]]) -> tuple[mx.array, list[mx.array]]:
        """Each row's logits processors over its context (which grows by its fed row)."""
        per_row = self.logits_processors or []
        if not any(per_row):
            return logits, []
        out, context = [], []
        for e, row in enumerate(fed):
            sample = logits[e:e + 1]
            processors = per_row[e] or ()
            if processors:
                seen = self._token_context[e].update_and_fetch(mx.array(row, dtype=mx.int32))
                context.append(seen)
                for processor in processors:
                    sample = processor(seen, sample)
            out.append(sample)
        return mx.concatenate(out, axis=0), context

    def _sample(self, logprobs: mx.array) -> mx.array:
        """mlx-lm's sampling: one call when the rows share a sampler."""
        samplers = [self.fallback_sampler if s is None else s for s in self.samplers or []]
        if not samplers or all(s is samplers[0] for s in samplers):
            return (samplers[0] if samplers else self.fallback_sampler)(logprobs)
        return mx.concatenate([s(logprobs[e:e + 1]) for e, s in enumerate(samplers)], axis=0)

    def filter(self, keep: list[int]) -> None:
        gone = set(self.uids).difference(self.uids[i] for i in keep)
        super().filter(keep)
        for uid in gone:
            self.fills.pop(uid, None)


def step_tokens() -> int:
    """Query positions one shared fill step may run (rows x width):
    ``MLXBUN_FILL_BATCH_TOKENS``, else none on the CPU and 512 on a GPU."""
    raw = os.environ.get("MLXBUN_FILL_BATCH_TOKENS")
    if raw:
        return int(raw)
    return CPU_STEP_TOKENS if mx.default_device() == mx.cpu else GPU_STEP_TOKENS


def install(gen: BatchGenerator) -> None:
    """Give ``gen`` (fresh: its generation batch still empty) the fill step."""
    try:
        batch = FillBatch.empty(gen.model, gen.sampler)
    except (AttributeError, TypeError):  # an mlx-lm whose internals differ: no batch fill
        return
    batch.fills, batch.runs = {}, {}
    gen._generation_batch = batch


def watch(gen: BatchGenerator, uid: int, fill: FillSession | None) -> None:
    """Row ``uid`` fills through ``fill`` once it decodes (None: it samples every token)."""
    batch = gen._generation_batch
    if fill is not None and isinstance(batch, FillBatch):
        batch.fills[uid] = fill


def forget(gen: BatchGenerator | None, uid: int) -> None:
    """Row ``uid`` left the lane (also before it decoded: cancelled while prefilling)."""
    batch = gen._generation_batch if gen is not None else None
    if isinstance(batch, FillBatch):
        batch.fills.pop(uid, None)


def run_of(gen: BatchGenerator, uid: int) -> list[int]:
    """The forced run fed after row ``uid``'s token in the step just taken."""
    batch: Any = gen._generation_batch
    runs: dict[int, list[int]] = getattr(batch, "runs", {})
    return runs.get(uid, [])
