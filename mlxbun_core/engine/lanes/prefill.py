"""How much prompt the batch lane reads per BatchGenerator turn.

Each turn decodes one token for every generating row, then reads one prefill chunk for
the rows still reading their prompt. The chunk is sized here: while nothing decodes,
mlx-lm's own step per prompt (time to first token is all that matters); while streams
run, a token budget shared by the prompt rows, so no stream freezes for long, growing
with the number of prompts waiting (their clients all wait for a first token). Either
way no longer than the engine's pacer allows, so a cancel lands within about one chunk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .pace import PrefillPacer

if TYPE_CHECKING:
    import mlx.nn as nn
    from mlx_lm.generate import BatchGenerator

    from ..job import GenerationJob

PREFILL_ROWS = 8  # prompts prefilled together in one chunk
PREFILL_TOKENS = 2048  # tokens of one chunk (all its rows) while a few rows are decoding
PREFILL_TOKENS_MAX = 8192  # ... growing with the prompts waiting, up to this
IDLE_STEP = 2048  # tokens per row and chunk when nothing decodes (mlx-lm's own step)


def make_generator(model: nn.Module, cap: int) -> BatchGenerator:
    """mlx-lm's BatchGenerator for up to ``cap`` rows (made on the worker thread)."""
    from mlx_lm.generate import BatchGenerator

    # prefill at most 8 prompts per chunk: 32 arrivals then start in waves
    # instead of all waiting for one huge chunk (the median TTFT halves)
    return BatchGenerator(model, completion_batch_size=cap,
                          prefill_batch_size=min(cap, PREFILL_ROWS), prefill_step_size=IDLE_STEP)


def size_chunk(gen: BatchGenerator, pacer: PrefillPacer, jobs: list[GenerationJob],
               shared: int = PREFILL_TOKENS) -> int:
    """Set ``gen``'s prefill step for a turn over the rows of ``jobs`` (``shared``: the
    chunk's token budget while rows decode); the chunk's token budget (0: no prompt is
    being read)."""
    prefilling = sum(1 for job in jobs if job.session.t_first is None)
    decoding = len(jobs) - prefilling
    rows = max(1, min(prefilling, PREFILL_ROWS))
    if decoding == 0:
        budget = IDLE_STEP * rows
    else:
        budget = min(PREFILL_TOKENS_MAX, max(shared, 512 * prefilling))
    budget = pacer.chunk(budget)
    gen.prefill_step_size = gen._prompt_batch.prefill_step_size = max(1, budget // rows)
    return budget if prefilling else 0


def paced_turn(gen: BatchGenerator, pacer: PrefillPacer, asked: int) -> Any:
    """One BatchGenerator turn; a turn that reads prompts (``asked`` tokens) feeds the
    pacer."""
    stats = getattr(gen, "stats", None)
    if not asked or stats is None:
        return gen.next()
    with stats() as measured:
        out = gen.next()
    pacer.record(measured.prompt_tokens, measured.prompt_time, asked)
    return out
