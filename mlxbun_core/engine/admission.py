"""Memory admission: how long a context fits, and how many rows may decode at once.

The numbers come from :mod:`mlxbun_core.library.fit` (KV bytes per token from the
config: layers, KV heads, head dim, sliding windows, recurrent state, dtype, and the
``--kv-quant`` bits), so
``/stats``, ``/fit`` and admission agree. The budget is ``--memory-budget``, else
what MLX reports the device may use (Metal's working set, CUDA's memory, or most
of the system RAM on the CPU backend).

- At start: a prompt that leaves no room in ``max_safe_context`` is a 400
  ``context_over_budget``; a broad ``max_tokens`` (or none) is clamped to the room
  left, never rejected.
- In the batch lane: a row is admitted only when its worst-case KV (prompt plus its
  completion budget) fits beside the rows already running; otherwise it waits.
- A row that speculates with the model's MTP head (``draft_kind: "mtp"``) also bills
  the head's own cache: the predictor's ``kv_bytes_per_token`` per token of that same
  worst case (the head keeps a row per target position). Every lane reserves through
  :meth:`Admission.reserve`, so the serial lane and a lone stream count it too.
- The head's weights (:class:`HeadCost`) count as weights once they are resident (loaded
  at start under ``--draft-kind mtp``, else by the first request drafting with it) or a
  row drafting with it is reserved (it loads them): the room every row fits in, and the
  context ceiling, shrink by them from then on. An MTP request is always held to the
  ceiling with the head's weights and its cache billed (``mtp_enforced_context_tokens``),
  so one that could never fit is a 400 before it starts and a broad ``max_tokens`` is
  clamped to what fits with the head, whether or not the head has loaded yet.
- Without ``--batch``, the row cap comes from the same room (``default_batch``).
- ``--kv-budget`` caps the KV every reserved row's worst case adds up to, whatever the
  memory would hold: a batch joiner that would pass it waits for rows to finish, and a
  request whose worst case passes it alone is a 400 ``kv_over_budget`` before it starts
  (its ``max_tokens`` counts whole: an uncapped one is billed to the context ceiling).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import APIError
from ..library import fit
from ..model import LoadedModel
from ..models.facts import weight_bytes
from .speculate.config import MTP

log = logging.getLogger("mlxbun.admission")

if TYPE_CHECKING:
    from ..contract import TokenPredictor
    from .job import GenerationJob
    from .speculate import SpecConfig


@dataclass(frozen=True)
class HeadCost:
    """What a model's MTP head costs in memory (see :func:`head_cost`)."""

    weight_bytes: int  # its own weights (not the target's it shares), once resident
    kv_bytes_per_token: int  # its cache, per token of a row drafting with it
    drafts: bool  # rows asking for it draft with it here (not under a KV scheme)
    resident: Callable[[], bool]  # whether its weights are loaded now


def head_cost(predictor: TokenPredictor | None, kv_scheme: bool) -> HeadCost | None:
    """The MTP head's costs as admission bills them (None: no head). Under a KV scheme
    (``kv_scheme``) rows asking for the head decode plainly, so it drafts nothing and its
    cache costs nothing; its weights still count if ``--draft-kind mtp`` loaded them.
    Attributes the contract added after its first release are read with defaults: no
    cache or weight bytes named, and weights taken as resident unless it says."""
    if predictor is None:
        return None
    kv = 0 if kv_scheme else max(0, int(getattr(predictor, "kv_bytes_per_token", 0)))
    return HeadCost(max(0, int(getattr(predictor, "weight_bytes", 0))), kv, not kv_scheme,
                    lambda: bool(getattr(predictor, "loaded", True)))


@dataclass(frozen=True)
class Ceiling:
    """One case's limits: the plan, the context admitted, and the room rows' KV shares."""

    weights_bytes: int
    plan: fit.MemoryPlan
    enforced_context: int
    kv_room: int


def drafts_with_head(spec: SpecConfig | None) -> bool:
    """Whether a job's speculation asks for the model's MTP head."""
    return spec is not None and spec.kind == MTP


class Admission:
    def __init__(self, model: LoadedModel, budget_bytes: int | None = None,
                 kv_bits: int | None = None, head: HeadCost | None = None):
        """``kv_bits``: the server's KV quantization (``--kv-quant``), billed per token;
        ``head``: the MTP head's weights and cache (None: no head)."""
        # a model that streams weights from disk (routed experts read on demand) names
        # the bytes its cache may fill: billed as weights, beside what is resident
        self.model_weights_bytes = (weight_bytes(model.model)
                                    + int(model.extras.get("reserved_weight_bytes", 0)))
        machine = fit.machine()
        self.budget_bytes = int(budget_bytes) if budget_bytes else machine.usable_bytes
        self.budget_source = "--memory-budget" if budget_bytes else f"{machine.device} (MLX)"
        # the operator's --memory-budget, or None (the machine's figure): /stats' field
        self.explicit_budget_bytes = int(budget_bytes) if budget_bytes else None
        self.kv_bits = kv_bits
        self._config = model.config
        self._window = model.context_window or fit.NO_LIMIT_CONTEXT
        self.head = head
        self.head_bytes_per_token = head.kv_bytes_per_token if head is not None else 0
        self.head_weight_bytes = head.weight_bytes if head is not None else 0
        # the cases: the target alone, with the head's weights resident, and a row
        # drafting with the head (its weights and its cache)
        self._plain = self._case_of(self.model_weights_bytes)
        self._loaded = (self._case_of(self.model_weights_bytes + self.head_weight_bytes)
                        if self.head_weight_bytes else self._plain)
        self._drafting = (self._case_of(self.model_weights_bytes + self.head_weight_bytes,
                                        self.head_bytes_per_token)
                          if head is not None and head.drafts else None)
        self.layout = self._plain.plan.kv
        self._lock = threading.Lock()
        self.reserved_bytes = 0
        self._head_rows = 0  # reserved rows drafting with the head (they load it)
        self.adapter_bytes = 0  # LoRA factors held (mounted and stacked per row): set_adapter_bytes
        self.waits = 0  # times a row had to wait for memory
        self.kv_budget_bytes: int | None = None  # --kv-budget (set_kv_budget)
        self.kv_budget_waits = 0  # times a row waited for --kv-budget (counted in waits too)
        # (rows, bytes): passes of that many rows unpack a quantized layer's weights, the
        # largest of them that big (wide_quant.py; (0, 0): they never do). Priced per step.
        self.unpacked: tuple[int, int] = (0, 0)

    @property
    def config(self) -> dict[str, Any]:
        """The model's HF config (what a step's temporaries are priced by)."""
        return self._config

    def _case_of(self, weights: int, extra_per_token: int = 0) -> Ceiling:
        plan = fit.plan(self._config, weights, self.budget_bytes, kv_bits=self.kv_bits,
                        extra_bytes_per_token=extra_per_token)
        enforced = min(self._window, plan.max_safe_context)
        # what every running row's KV may add up to: the budget less the weights and the
        # scratch of one prefill chunk (as long as the longest admitted context)
        chunk = min(fit.PREFILL_CHUNK, max(1, enforced))
        room = self.budget_bytes - weights - fit.transient_bytes(self._config, chunk)
        return Ceiling(weights, plan, enforced, room)

    @property
    def head_billed(self) -> bool:
        """Whether the head's weights count now: resident, or about to be (a row drafting
        with it is reserved)."""
        return self.head is not None and (self._head_rows > 0 or self.head.resident())

    @property
    def now(self) -> Ceiling:
        """The limits a plain row meets now."""
        return self._loaded if self.head_billed else self._plain

    def ceiling(self, mtp: bool = False) -> Ceiling:
        """The limits a row meets now (``mtp``: one drafting with the head, whose weights
        count for it whether or not they have loaded yet)."""
        return self._drafting if mtp and self._drafting is not None else self.now

    # what a plain row meets now (the head's weights included once they count)
    @property
    def weights_bytes(self) -> int:
        return self.now.weights_bytes

    @property
    def plan(self) -> fit.MemoryPlan:
        return self.now.plan

    @property
    def max_safe_context(self) -> int:
        return self.now.plan.max_safe_context

    @property
    def enforced_context(self) -> int:
        return self.now.enforced_context

    @property
    def kv_room(self) -> int:
        return self.now.kv_room

    def limit(self, prompt_tokens: int, max_tokens: int | None, mtp: bool = False) -> int:
        """The completion budget of a request (``mtp``: one drafting with the head, held to
        the ceiling with the head's weights and cache): 400 when the prompt leaves no room."""
        ceiling = self.ceiling(mtp).enforced_context
        room = ceiling - prompt_tokens
        if room <= 0:
            raise self._too_long(prompt_tokens, ceiling, mtp)
        limit = room if max_tokens is None else min(max_tokens, room)
        self._check_kv_budget(prompt_tokens, limit, max_tokens is None, mtp)
        return limit

    def _projected(self, tokens: int, head: bool) -> int:
        """Worst-case KV of a row of ``tokens`` tokens (``head``: the MTP head's cache too)."""
        return self.layout.bytes_at(tokens) + (self.head_bytes_per_token if head else 0) * tokens

    def _check_kv_budget(self, prompt_tokens: int, limit: int, uncapped: bool,
                         mtp: bool) -> None:
        """The 400 for a request whose worst case passes ``--kv-budget`` alone: it could
        never be admitted, so it is refused rather than left waiting for ever."""
        budget = self.kv_budget_bytes
        if budget is None:
            return
        need = self._projected(prompt_tokens + limit, mtp and self._drafting is not None)
        if need <= budget:
            return
        hint = ("no max_tokens was sent and the server sets no cap, so it is billed to the "
                "whole context; send max_tokens" if uncapped
                else "a smaller max_tokens or a shorter prompt fits")
        log.info("refused a request of %d + %d tokens: %d bytes of KV over --kv-budget %d",
                 prompt_tokens, limit, need, budget)
        raise APIError(f"this request's KV (prompt {prompt_tokens} + max_tokens {limit} "
                       f"tokens, {need} bytes) exceeds the server's --kv-budget of {budget} "
                       f"bytes on its own ({hint})", status=400, type="memory_admission",
                       code="kv_over_budget")

    def _too_long(self, prompt_tokens: int, ceiling: int, mtp: bool) -> APIError:
        """The 400 for a prompt that leaves no room: both numbers and what sets the
        ceiling (the window: ``--context-length``; memory: the budget), logged too."""
        plain, where = self.now.enforced_context, ""
        if mtp and self._drafting is not None and plain > ceiling:
            where = " for a request drafting with the MTP head"
            why = f"its weights and KV cache count; draft_kind \"none\" admits {plain}"
        elif ceiling >= self._window:
            why = "the model's context window; serve with --context-length N for a longer one"
        else:
            why = (f"what fits a memory budget of {self.budget_bytes / 1e9:.1f} GB beside "
                   f"the weights; --memory-budget or --kv-quant 8 changes it")
        log.info("refused a prompt of %d tokens: over the %d admitted%s (%s)", prompt_tokens,
                 ceiling, where, why)
        return APIError(f"prompt has {prompt_tokens} tokens; this server admits at most "
                        f"{ceiling} tokens of context{where} ({why})", status=400,
                        type="memory_admission", code="context_over_budget")

    def _drafts(self, job: GenerationJob) -> bool:
        return self._drafting is not None and drafts_with_head(job.spec)

    def row_bytes(self, job: GenerationJob) -> int:
        """``job``'s worst-case KV: its prompt plus completion budget, the MTP head's
        cache included when it drafts with the head."""
        tokens = len(job.request.prompt_tokens) + (job.limit or 0)
        return self._projected(tokens, self._drafts(job))

    def fits(self, job: GenerationJob) -> bool:
        """Whether ``job`` fits beside every row already reserved (in the room left once
        the head's weights count, when it drafts with the head)."""
        room = self.ceiling(mtp=True).kv_room if self._drafts(job) else self.kv_room
        need = self.row_bytes(job)
        ok = self.reserved_bytes + self.adapter_bytes + need <= room
        if ok and self.kv_budget_bytes is not None \
                and self.reserved_bytes + need > self.kv_budget_bytes:
            ok = False
            self.kv_budget_waits += 1
        if not ok:
            self.waits += 1
        return ok

    def set_kv_budget(self, n: int | None) -> None:
        """``--kv-budget``: the rows' aggregate worst-case KV cap (None: memory alone)."""
        self.kv_budget_bytes = int(n) if n else None

    def set_adapter_bytes(self, n: int) -> None:
        """What the adapters hold now: rows admitted later fit beside it."""
        self.adapter_bytes = n

    def reserve(self, job: GenerationJob) -> None:
        with self._lock:
            job.reserved_bytes = self.row_bytes(job)
            self.reserved_bytes += job.reserved_bytes
            job.reserved_head = self._drafts(job)
            self._head_rows += job.reserved_head

    def release(self, job: GenerationJob) -> None:
        with self._lock:
            self.reserved_bytes -= getattr(job, "reserved_bytes", 0)
            job.reserved_bytes = 0
            self._head_rows -= getattr(job, "reserved_head", False)
            job.reserved_head = False

    def stats(self) -> dict[str, Any]:
        now = self.now
        return {"budget_bytes": self.budget_bytes, "budget_source": self.budget_source,
                "memory_budget_bytes": self.explicit_budget_bytes,
                "weights_bytes": now.weights_bytes,
                "kv_bytes_per_token": self.layout.bytes_per_token,
                "mtp_head_weight_bytes": self.head_weight_bytes,
                "mtp_head_weights_billed": self.head_billed,
                "mtp_head_kv_bytes_per_token": self.head_bytes_per_token,
                "mtp_enforced_context_tokens": (self._drafting.enforced_context
                                                if self._drafting is not None else None),
                "max_safe_context": now.plan.max_safe_context,
                "enforced_context_tokens": now.enforced_context,
                "kv_room_bytes": now.kv_room, "reserved_kv_bytes": self.reserved_bytes,
                "adapter_bytes": self.adapter_bytes,
                "memory_waits": self.waits}


def default_batch(model: LoadedModel, admission: Admission) -> fit.BatchPlan:
    """The ``--batch`` to use when none is given (see :func:`fit.batch_plan`). Quantized
    weights keep CUDA's 8-row cap even where their layers unpack for wide passes
    (``wide_quant.py``): the decode step batches then (2.2x mlx-lm's at 32 rows on an
    H100), but 32 served clients were slower end to end (bench/NOTES.md, 2026-12-07)."""
    from ..backend import backend
    from ..library.checkpoint import quantization

    quantized = quantization(model.config or {})[0] is not None
    return fit.batch_plan(admission.layout, admission.kv_room, backend=backend(),
                          quantized=quantized,
                          context=min(fit.TYPICAL_CONTEXT, admission.enforced_context),
                          ranks=int(model.extras.get("ranks", 1)))
