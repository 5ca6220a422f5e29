"""What the engine runs on its worker thread at start, before ``/health`` says ready, so
the first request pays for none of it: the KV scheme's kernel check, the prefill pacer's
calibration, the prefill buckets' shapes and the SSD tier's two rates."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .. import kvquant
from ..kvquant.probe import check_kernels, model_dtype
from . import attention_route, prefill_shapes
from .lanes.pace import MAX_CHUNK, PrefillPacer

if TYPE_CHECKING:
    from ..model import LoadedModel
    from .admission import Admission
    from .prompt_cache import PrefixCache
    from .worker import ModelWorker

log = logging.getLogger("mlxbun.engine")


def check_kv(model: LoadedModel, kv: kvquant.KVScheme, admission: Admission,
             worker: ModelWorker) -> None:
    """Warn about a KV scheme the layout makes pointless; a quantized KV cache whose
    kernel this build lacks fails here, not mid-reply."""
    if warning := kvquant.startup_warning(kv, admission.layout):
        log.warning(warning)
    if kv.bits and model.kind == "generate":
        worker.run_sync(lambda: check_kernels(kv.bits or 8, kv.group_size,
                                              model.config, model_dtype(model.model)))


def warm_prefill(model: LoadedModel, worker: ModelWorker, pacer: PrefillPacer) -> None:
    """Calibrate the pacer and run the prefill buckets' lengths (a generating model)."""
    if model.kind != "generate":
        return
    attention_route.install()  # CUDA: no cuDNN graph per short query's shape
    worker.run_sync(lambda: pacer.calibrate(model.model))
    worker.run_sync(lambda: prefill_shapes.warm(model.model, MAX_CHUNK))


def seed_ssd_rates(model: LoadedModel, prefix: PrefixCache, worker: ModelWorker,
                   pacer: PrefillPacer) -> None:
    """Both rates the SSD tier's restore-vs-recompute check weighs, before the first
    request: the restore rate (kept, or probed now on the worker) and a prefill
    rate kept from real prompts of an earlier run, over the calibration."""
    tier = prefix.tier
    if tier is not None and model.kind == "generate":
        worker.run_sync(tier.seed_rates)
        pacer.seed(tier.prefill.tps or 0.0)
