"""What the engine runs on its worker thread at start, before ``/health`` says ready, so
the first request pays for none of it: the KV scheme's kernel check, the prefill pacer's
calibration, the prefill buckets' shapes, the quantized matmuls at the row counts a batch
reaches, the batch's passes at two rows and the SSD tier's two rates. :func:`warm` times
the warm-ups for the banner and ``/stats``."""

from __future__ import annotations

import functools
import logging
import time
from typing import TYPE_CHECKING, Any

from .. import kvquant
from ..backend import backend
from ..kvquant.probe import check_kernels, model_dtype
from ..runconfig import current
from . import attention_route, prefill_shapes, wide_quant
from .lanes.batch import BatchLane
from .lanes.pace import MAX_CHUNK, PrefillPacer

if TYPE_CHECKING:
    from ..model import LoadedModel
    from .admission import Admission
    from .prompt_cache import PrefixCache
    from .worker import ModelWorker

log = logging.getLogger("mlxbun.engine")


def kv_scheme(value: object, model: LoadedModel) -> kvquant.KVScheme:
    """``--kv-quant``'s scheme for ``model`` (``config`` reads its kv_config.json); a
    missing or malformed file stops the start with the reason."""
    from ..kvquant.probe import KVQuantUnavailable

    try:
        return kvquant.parse(value, model.path)
    except ValueError as exc:
        raise KVQuantUnavailable(str(exc)) from None


def check_kv(model: LoadedModel, kv: kvquant.KVScheme, admission: Admission,
             worker: ModelWorker) -> None:
    """Warn about a KV scheme the layout makes pointless; a quantized KV cache whose
    kernel this build lacks fails here, not mid-reply."""
    if warning := kvquant.startup_warning(kv, admission.layout):
        log.warning(warning)
    if kv.enabled and not kv.turbo and model.kind == "generate":  # (turbo: float attention)
        for bits in sorted({b for _, b, _ in kv.rules or ()} - {0} or {kv.bits or 8}):
            worker.run_sync(functools.partial(check_kernels, bits, kv.group_size,
                                              model.config, model_dtype(model.model)))


def kv_eligible(model: LoadedModel, kv: kvquant.KVScheme) -> list[bool] | None:
    """Per cache index, whether a per-layer scheme (config, turbo) can quantize it: a
    plain full-attention ``KVCache`` whose head dim divides into groups (None for the
    uniform schemes, which the fit layout counts)."""
    if not kv.enabled or kv.bits or model.kind != "generate":
        return None
    from mlx_lm.models.cache import KVCache

    from .. import cache_ops
    from ..library import fit

    t = fit.text_config(model.config or {})
    ok = fit.quantizable(t, "full", kv.group_size)
    return [ok and type(c) is KVCache for c in cache_ops.make(model.model)]


def unpack_quantized(model: LoadedModel, worker: ModelWorker) -> int:
    """Let a generating model's quantized layers dequantize for passes of many rows where
    the device gains from it (``wide_quant.py``): the row count from which they do, 0
    when they never do (no quantized layers, or the switch or the backend says no)."""
    rows = wide_quant.min_rows(backend(), current().engine.unpack_quantized)
    if not rows or model.kind != "generate":
        return 0
    swapped = worker.run_sync(lambda: wide_quant.install(model.model, rows))
    if not swapped:
        return 0
    log.info("quantized layers: %d dequantize for passes of %d rows or more", swapped, rows)
    return rows


def warm(model: LoadedModel, worker: ModelWorker, pacer: PrefillPacer) -> dict[str, Any]:
    """Calibrate the pacer, run the prefill buckets' lengths and the batch lane's passes
    (a generating model); what ran and how long it took (``/stats`` ``batch.warmup``)."""
    if model.kind != "generate":
        return {}
    attention_route.install()  # CUDA: no cuDNN graph per short query's shape
    t0 = time.perf_counter()
    worker.run_sync(lambda: pacer.calibrate(model.model))
    buckets = worker.run_sync(lambda: prefill_shapes.warm(model.model, MAX_CHUNK))
    matmuls = worker.run_sync(lambda: wide_quant.warm_matmuls(model.model))
    experts = worker.run_sync(lambda: wide_quant.warm_experts(model.model))
    t1 = time.perf_counter()
    lane = next((lane for lane in worker.lanes if isinstance(lane, BatchLane)), None)
    batch = worker.run_sync(lane.warm) if lane is not None else {}
    t2 = time.perf_counter()
    return {"prefill_s": round(t1 - t0, 3), "prefill_buckets": buckets,
            "quantized_matmuls": matmuls, "quantized_expert_blocks": experts,
            "batch_s": round(t2 - t1, 3) if batch else None,
            "batch_passes": batch.get("passes", 0), "batch_blocks_held": batch.get("blocks_held"),
            "batch_blocks_left": batch.get("blocks_left"),
            "decode_step": batch.get("decode_step"), "solo_step": batch.get("solo_step")}


def describe(done: dict[str, Any]) -> str | None:
    """The banner's warm-up note (None: nothing was warmed)."""
    if not done:
        return None
    total = done["prefill_s"] + (done["batch_s"] or 0.0)
    batch = (f"batch passes at 2 rows {done['batch_s']:.2f} s" if done["batch_passes"]
             else "no batch lane")
    step = done.get("decode_step")
    if step:  # the decode step's way (engine/batch/tune.py), and whether it was timed here
        batch += f", decode steps {step['way']}" + (" (timed)" if step["why"] == "timed" else "")
    return f"warm-up {total:.2f} s (prefill {done['prefill_s']:.2f} s, {batch})"


def seed_ssd_rates(model: LoadedModel, prefix: PrefixCache, worker: ModelWorker,
                   pacer: PrefillPacer) -> None:
    """Both rates the SSD tier's restore-vs-recompute check weighs, before the first
    request: the restore rate (kept, or probed now on the worker) and a prefill
    rate kept from real prompts of an earlier run, over the calibration."""
    tier = prefix.tier
    if tier is not None and model.kind == "generate":
        worker.run_sync(tier.seed_rates)
        pacer.seed(tier.prefill.tps or 0.0)
