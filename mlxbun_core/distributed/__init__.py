"""Serving one model across several processes (``mlxbun serve --distributed``).

Every rank is started by ``mlx.launch`` and joins one ``mx.distributed`` group
(:mod:`.group`); every rank loads only its shard (tensor parallel through the model's
``shard()``, or pipeline parallel: :class:`~mlxbun_core.model.ShardPlan`). Rank 0 runs the
whole engine: HTTP, lanes, batching, the prefix cache, sampling, grammars and tool
parsing. The other ranks (followers) run no engine at all; they mirror rank 0's
forward passes:

- :mod:`.lockstep`: rank 0's model is wrapped so that each call first sends a small
  descriptor (the cache objects it runs on, the shapes of its inputs) and then the input
  arrays themselves, over the group's own collectives (:mod:`.channel`), on one stream
  so that every rank runs the same collectives in the same order;
- the batch lane's KV (the engine's block pool) and recurrent states change between
  passes only as its journal says (``engine/batch/journal.py``: pool growth, block
  copies, state operations), and each batch pass is plain data (its window); the
  followers apply both to pools and states of their own;
- :mod:`.mirror`: the serial lane's mlx-lm caches: what rank 0 makes, copies and trims
  through ``cache_ops.py`` is recorded and replayed by the followers on their own
  (sharded) cache objects before the next forward pass;
- :mod:`.follower`: a follower's loop (receive, replay, forward, repeat);
- :mod:`.watchdog`: rank 0 pings the group through its worker every second; a failed
  collective or a ping unanswered for the timeout marks the engine unavailable (503
  ``engine_unavailable``), ends the open requests with an error and exits non-zero.
"""

from .group import DistributedGroup, init_group

__all__ = ["DistributedGroup", "init_group"]
