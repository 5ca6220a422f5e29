"""What a request runs with: mounted adapters and the ordered sets of them.

Plain records, apart from the manager that mounts them and the per-row layers that
stack them (both import from here).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field

from . import formats

_serials = itertools.count(1)


@dataclass(eq=False)
class Mounted:
    id: str
    info: formats.AdapterInfo
    parts: dict  # module path -> (a, b, scale)
    serial: int = field(default_factory=lambda: next(_serials))
    mixable: bool = field(init=False)  # can run per row (plain linear layers only)

    def __post_init__(self) -> None:
        self.mixable = all(a.ndim == 2 for a, _, _ in self.parts.values())

    @property
    def ram_bytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b, _ in self.parts.values())

    @property
    def rank(self) -> int:
        from .layers import rank_of

        return max(rank_of(a) for a, _, _ in self.parts.values())

    def row(self) -> dict:
        return {"id": self.id, "path": str(self.info.path), "format": self.info.format,
                "rank": self.rank, "scale": self.info.scale, "base_model": self.info.base_model,
                "size_bytes": self.info.size_bytes, "mounted_layers": len(self.parts),
                "ram_bytes": self.ram_bytes}


@dataclass(frozen=True)
class AdapterSet:
    """The adapters one request runs with, in the order their residuals are summed."""

    adapters: tuple = ()

    @functools.cached_property
    def key(self) -> str:
        """Canonical identity: ``""`` for the base model, else ``id#serial`` joined by ``+``."""
        return "+".join(f"{a.id}#{a.serial}" for a in self.adapters)

    @property
    def spec(self) -> str:
        return "+".join(a.id for a in self.adapters) or "none"

    def __bool__(self) -> bool:
        return bool(self.adapters)


NO_ADAPTERS = AdapterSet()


def next_serial() -> int:
    """A fresh number from the mounts' sequence (keys that must never equal a set's)."""
    return next(_serials)
