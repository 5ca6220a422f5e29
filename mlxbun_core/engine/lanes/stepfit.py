"""Room for a step's temporaries (a mixin of :class:`~.pressure.Relief`, which the batch
lane extends): the pool's growth keeps it, and a planned step is cut to it.

The pool grows into the memory the governor measures, but a step needs memory beside
it: the gathered K and V of its widest layer, the attention scores, the activations and
the logits (``batch/transient.py``). Two rules keep that room:

- **The reserve.** The pool's limit leaves free what the widest step the scheduler may
  plan needs: a decode step of the lane's whole row cap over the longest row's
  positions, or a prefill chunk of ``PREFILL_FLOOR`` tokens, whichever is larger
  (a wider chunk is cut to what is free when it is planned)
  (``step_reserve_bytes`` in ``/stats`` ``memory``). It follows the rows: a longer
  prompt admitted raises it, and the pool stops growing sooner.
- **The plan fits.** Before a step runs, its estimate is held against the memory free
  now less what the step's pool growth takes: a prefill chunk that would not fit reads
  fewer tokens, then fewer rows; a decode step that would not fit (another process took
  memory since) preempts its youngest rows, recomputed later as any preempted row is.
  A step is never planned past the room when one row's smallest step fits in it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ..batch import BLOCK_SIZE
from ..batch.transient import StepCost, decode_bytes, fit_chunks, keys_of, prefill_bytes
from ..scheduler import StepPlan

if TYPE_CHECKING:
    from ..admission import Admission
    from ..batch import Batch
    from ..memory import Governor

PREFILL_FLOOR = 16  # tokens (a block) of the smallest prefill chunk the reserve keeps room for


log = logging.getLogger("mlxbun.engine")

class StepFit:
    """The step room of :class:`~.batch.BatchLane` (which holds what is declared here)."""

    governor: Governor
    admission: Admission | None
    cap: int
    _batch: Batch | None
    _rows: dict[int, Any]

    def _settle(self, uids: list[int]) -> None:
        raise NotImplementedError

    def _preempt(self, uids: list[int], keep_pool: bool) -> int:
        raise NotImplementedError

    def _block_bytes(self) -> int:
        raise NotImplementedError

    def _init_stepfit(self) -> None:
        config = self.admission.config if self.admission is not None else None
        # None: no config to price steps by (a lane without admission: tests)
        unpacked = self.admission.unpacked if self.admission is not None else (0, 0)
        self._cost = StepCost.of(config, unpacked) if config else None

    def _step_reserve(self, tokens: int = 0) -> int:
        """Bytes the pool leaves free for the widest step: the row cap decoding at the
        longest row's positions (``tokens``: a newcomer's, when longer), or the floor
        prefill chunk of one row there."""
        cost, batch = self._cost, self._batch
        if cost is None:
            return 0
        longest = tokens
        if batch is not None:
            longest = max([longest, *(r.table.length + len(r.todo) + len(r.refeed)
                                      for r in batch.rows.values())])
        bs = batch.pool.block_size if batch is not None else BLOCK_SIZE
        gathered = batch is None or not batch.direct
        decode = cost.bytes(self.cap, 1, keys_of([longest], 1, bs), True, gathered)
        chunk = min(PREFILL_FLOOR, max(1, longest))
        prefill = cost.bytes(1, chunk, keys_of([max(0, longest - chunk)], chunk, bs), False)
        reserve = max(decode, prefill)
        self.governor.step["reserve_bytes"] = reserve
        return reserve

    def _decode_fits(self, tokens: int) -> bool:
        """Whether a decode step of the running rows and a newcomer of ``tokens``
        positions fits in the memory free now (else the newcomer waits: admitted, it
        would only be preempted again by :meth:`_fit_plan`)."""
        cost, batch = self._cost, self._batch
        if cost is None or batch is None or not batch.rows:
            return True
        starts = [r.table.length + len(r.todo) for r in batch.rows.values()]
        rows = len(starts) + 1
        keys = keys_of([*starts, tokens], 1, batch.pool.block_size)
        need = cost.bytes(rows, 1, keys, True, not batch.direct)
        return need <= self.governor.room(need)

    def _growth_bytes(self, batch: Batch, plan: StepPlan) -> int:
        """Bytes the pool's storage grows by when ``plan`` runs (the executor's
        ``_grow``: doubling, up to the limit)."""
        pool = batch.pool
        rows = batch.rows
        need = sum(rows[u].table.cost(rows[u].table.length, rows[u].table.length + 1)
                   for u in batch.decoding) if plan.decode else 0
        need += sum(rows[u].table.cost(rows[u].table.length, rows[u].table.length + n)
                    for u, n in plan.prefill.items())
        if need <= pool.free:
            return 0
        grown = min(pool.limit, pool.capacity + max(need - pool.free, pool.capacity))
        return max(0, grown - pool.capacity) * self._block_bytes()

    def _fit_plan(self, batch: Batch, plan: StepPlan) -> StepPlan:
        """``plan`` cut to the room free now (module doc); what it is estimated to take
        goes to the governor's step figures."""
        cost = self._cost
        if cost is None:
            return plan
        gov = self.governor
        decode = decode_bytes(cost, batch) if plan.decode else 0
        growth = self._growth_bytes(batch, plan)
        chunks = {u: n for u, n in plan.prefill.items() if u in batch.rows}
        want = max(decode, prefill_bytes(cost, batch, chunks) if chunks else 0)
        room = gov.room(want + growth) - growth  # (short: MLX's cache given back first)
        preempted = 0
        while decode > room and len(batch.decoding) > 1:
            young = [max(batch.decoding)]
            self._settle(young)
            preempted += self._preempt(young, keep_pool=True)
            decode = decode_bytes(cost, batch)
        if preempted:
            log.warning("a decode step needs %s, %s is free beside the pool's growth of %s: "
                        "preempted %d rows, recomputed when memory allows", _mib(decode),
                        _mib(room + growth), _mib(growth), preempted)
        chunks = {u: n for u, n in chunks.items() if u in batch.rows}  # (some preempted)
        fitted = fit_chunks(cost, batch, chunks, room, PREFILL_FLOOR) if chunks else {}
        estimate = max(decode, prefill_bytes(cost, batch, fitted))
        gov.planned(estimate, room, trimmed=fitted != plan.prefill or preempted > 0)
        return StepPlan(fitted, plan.decode and bool(batch.decoding), plan.asked)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB"
