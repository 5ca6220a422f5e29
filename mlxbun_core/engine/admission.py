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
- Without ``--batch``, the row cap comes from the same room (``default_batch``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, cast

from ..errors import APIError
from ..library import fit
from ..model import LoadedModel
from .speculate.config import MTP

if TYPE_CHECKING:
    import mlx.core as mx
    import mlx.nn as nn

    from .job import GenerationJob


def weight_bytes(module: nn.Module) -> int:
    """Bytes of a model's parameters (shape arithmetic only: nothing is evaluated)."""
    from mlx.utils import tree_flatten

    leaves = cast("list[tuple[str, mx.array]]", tree_flatten(module.parameters()))
    return sum(v.nbytes for _, v in leaves)


class Admission:
    def __init__(self, model: LoadedModel, budget_bytes: int | None = None,
                 kv_bits: int | None = None, head_bytes_per_token: int = 0):
        """``kv_bits``: the server's KV quantization (``--kv-quant``), billed per token;
        ``head_bytes_per_token``: what the MTP head's cache adds per token of a row that
        drafts with it (0: no head, or one that never runs here)."""
        # a model that streams weights from disk (routed experts read on demand) names
        # the bytes its cache may fill: billed as weights, beside what is resident
        self.weights_bytes = (weight_bytes(model.model)
                              + int(model.extras.get("reserved_weight_bytes", 0)))
        machine = fit.machine()
        self.budget_bytes = int(budget_bytes) if budget_bytes else machine.usable_bytes
        self.budget_source = "--memory-budget" if budget_bytes else f"{machine.device} (MLX)"
        self.kv_bits = kv_bits
        self.head_bytes_per_token = max(0, int(head_bytes_per_token))
        self.plan = fit.plan(model.config, self.weights_bytes, self.budget_bytes, kv_bits=kv_bits)
        self.layout = self.plan.kv
        window = model.context_window or fit.NO_LIMIT_CONTEXT
        self.max_safe_context = self.plan.max_safe_context
        self.enforced_context = min(window, self.max_safe_context)
        # what every running row's KV may add up to: the budget less the weights and the
        # scratch of one prefill chunk (as long as the longest admitted context)
        chunk = min(fit.PREFILL_CHUNK, max(1, self.enforced_context))
        self.kv_room = (self.budget_bytes - self.weights_bytes
                        - fit.transient_bytes(model.config, chunk))
        self._lock = threading.Lock()
        self.reserved_bytes = 0
        self.adapter_bytes = 0  # LoRA factors held (mounted and stacked per row): set_adapter_bytes
        self.waits = 0  # times a row had to wait for memory

    def limit(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """The completion budget of a request: 400 when the prompt leaves no room."""
        room = self.enforced_context - prompt_tokens
        if room <= 0:
            raise APIError(
                f"prompt has {prompt_tokens} tokens; this server admits at most "
                f"{self.enforced_context} tokens of context (the model's window and a memory "
                f"budget of {self.budget_bytes / 1e9:.1f} GB)", status=400,
                type="memory_admission", code="context_over_budget")
        return room if max_tokens is None else min(max_tokens, room)

    def row_bytes(self, job: GenerationJob) -> int:
        """``job``'s worst-case KV: its prompt plus completion budget, the MTP head's
        cache included when it drafts with the head."""
        tokens = len(job.request.prompt_tokens) + (job.limit or 0)
        head = self.head_bytes_per_token if job.spec is not None and job.spec.kind == MTP else 0
        return self.layout.bytes_at(tokens) + head * tokens

    def fits(self, job: GenerationJob) -> bool:
        """Whether ``job`` fits beside every row already reserved."""
        ok = self.reserved_bytes + self.adapter_bytes + self.row_bytes(job) <= self.kv_room
        if not ok:
            self.waits += 1
        return ok

    def set_adapter_bytes(self, n: int) -> None:
        """What the adapters hold now: rows admitted later fit beside it."""
        self.adapter_bytes = n

    def reserve(self, job: GenerationJob) -> None:
        with self._lock:
            job.reserved_bytes = self.row_bytes(job)
            self.reserved_bytes += job.reserved_bytes

    def release(self, job: GenerationJob) -> None:
        with self._lock:
            self.reserved_bytes -= getattr(job, "reserved_bytes", 0)
            job.reserved_bytes = 0

    def stats(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "budget_source": self.budget_source,
                "weights_bytes": self.weights_bytes,
                "kv_bytes_per_token": self.layout.bytes_per_token,
                "mtp_head_kv_bytes_per_token": self.head_bytes_per_token,
                "max_safe_context": self.max_safe_context,
                "enforced_context_tokens": self.enforced_context,
                "kv_room_bytes": self.kv_room, "reserved_kv_bytes": self.reserved_bytes,
                "adapter_bytes": self.adapter_bytes,
                "memory_waits": self.waits}


def default_batch(model: LoadedModel, admission: Admission) -> fit.BatchPlan:
    """The ``--batch`` to use when none is given (see :func:`fit.batch_plan`)."""
    import mlx.core as mx

    from ..library.checkpoint import quantization

    backend = "cpu"
    if mx.default_device() == mx.gpu:
        cuda = getattr(mx, "cuda", None)
        backend = "cuda" if cuda is not None and cuda.is_available() else "metal"
    return fit.batch_plan(admission.layout, admission.kv_room, backend=backend,
                          quantized=quantization(model.config or {})[0] is not None,
                          context=min(fit.TYPICAL_CONTEXT, admission.enforced_context),
                          ranks=int(model.extras.get("ranks", 1)))
