"""The ``mx.distributed`` group a distributed serve runs in, and what ``/stats`` says of it."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

BACKENDS = ("any", "ring", "jaccl", "mpi", "nccl")


@dataclass
class DistributedGroup:
    """The group, this process's place in it, and the backend that carries it."""

    group: Any
    backend: str
    pipeline: bool = False
    mode: str = ""  # "tensor" or "pipeline", once the model is sharded
    alive: bool = True  # rank 0's view: every rank answered the last ping
    last_ping_ms: float | None = None
    problem: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return int(self.group.rank())

    @property
    def size(self) -> int:
        return int(self.group.size())

    def describe(self) -> dict[str, Any]:
        """``/stats`` and ``/health`` ``distributed``: size, backend, mode, ranks alive."""
        return {"size": self.size, "rank": self.rank, "backend": self.backend,
                "mode": self.mode, "alive": self.alive,
                "ranks": [{"rank": r, "alive": self.alive} for r in range(self.size)],
                "last_ping_ms": self.last_ping_ms, "problem": self.problem}


def backend_in_use(asked: str) -> str:
    """The backend ``mx.distributed.init`` picked: what was asked, else what ``mlx.launch``
    set up (its environment tells: a ring hostfile, NCCL's rendezvous, JACCL's devices)."""
    if asked != "any":
        return asked
    env = os.environ
    if "NCCL_HOST_IP" in env or "NCCL_PORT" in env:
        return "nccl"
    if "MLX_IBV_DEVICES" in env or "MLX_JACCL_COORDINATOR" in env:
        return "jaccl"
    if "OMPI_COMM_WORLD_SIZE" in env or "PMI_SIZE" in env:
        return "mpi"
    return "ring"


def init_group(backend: str = "any", pipeline: bool = False) -> DistributedGroup:
    """Join the group ``mlx.launch`` set up; a ``RuntimeError`` saying how to start it when
    this process was not started that way (a group of one serves nothing distributed)."""
    import mlx.core as mx

    group = mx.distributed.init(strict=False, backend=backend)
    if group.size() < 2:
        raise RuntimeError(
            "--distributed needs every rank started by mlx.launch, e.g. "
            "`mlx.launch -n 2 --backend ring -- mlxbun serve MODEL --distributed` "
            "(docs/distributed.md); this process is a group of one")
    return DistributedGroup(group, backend_in_use(backend), pipeline)
