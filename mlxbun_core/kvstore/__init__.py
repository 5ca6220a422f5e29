"""The SSD tier under the RAM prefix cache (``--ssd-cache DIR``).

- :mod:`.fileformat` — one entry per file: checked header, token ids, raw tensors;
  atomic writes (temp file under a lock, fsync, rename, fsync of the directory).
- :mod:`.codec` — any mlx-lm cache list to (layout, tensors) and back.
- :mod:`.index` — what is on disk, in memory (header-only start-up scan).
- :mod:`.writer` — the background write queue (urgent and write-behind jobs).
- :mod:`.store` — find, restore, write, cap, degrade: :class:`SsdStore`.
- :mod:`.identity` — the serving fingerprint and namespace keys.
- :mod:`.durability` — flush, drain demotion and shutdown, for the engine's callers.
- :mod:`.config`, :mod:`.flags` — settings and the ``serve`` flags.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .config import SsdConfig

if TYPE_CHECKING:
    from ..model import LoadedModel
    from .store import SsdStore

__all__ = ["SsdConfig", "open_store"]


def open_store(config: SsdConfig, model: LoadedModel, *,
               namespace_parts: Callable[[Any], list[Any] | None],
               busy: Callable[[], bool]) -> SsdStore:
    """The :class:`~.store.SsdStore` for a loaded model (``model``: a LoadedModel)."""
    import mlx.core as mx

    from .identity import serving_fingerprint
    from .store import SsdStore

    extra: dict[str, Any] = {"id": model.id, "family": model.family}
    if model.extras.get("rope_scaling"):  # --context-length stretched RoPE: other KV
        extra["rope_scaling"] = model.extras["rope_scaling"]
    fingerprint = serving_fingerprint(model.path, extra)
    # where host reads of a GPU buffer move it (CUDA), the writer gets its own copies
    private = mx.default_device() == mx.gpu and not mx.metal.is_available()
    return SsdStore(config, fingerprint, namespace_parts=namespace_parts, busy=busy,
                    private_copies=private)
