"""The prefix cache's SSD tier (``--ssd-cache``) as the engine opens it, and a cache
namespace as it may be written to disk (adapters named by their files, not by this
process's mount serials), so another run finds the entry only under the same weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..runconfig import current

if TYPE_CHECKING:
    from ..adapters import AdapterManager
    from ..kvstore import SsdConfig
    from ..kvstore.store import SsdStore
    from ..model import LoadedModel


def open_tier(config: SsdConfig | None, ram_bytes: int, model: LoadedModel,
              adapters: Callable[[], AdapterManager], busy: Callable[[], bool]
              ) -> SsdStore | None:
    """The SSD tier under a prefix cache of ``ram_bytes``, or None (no ``--ssd-cache``,
    or no RAM cache to sit under); ``adapters`` gives the engine's adapter manager
    when a namespace is written (it does not exist yet when the tier opens)."""
    if config is None or ram_bytes <= 0:
        return None
    from ..kvstore import open_store

    fixed = current().cache.ssd_spill_queue_bytes  # MLXBUN_SSD_SPILL_QUEUE_GB
    config.queue_bytes = max(config.queue_bytes, ram_bytes) if fixed is None else fixed
    return open_store(config, model,
                      namespace_parts=lambda ns: durable_namespace(ns, adapters()), busy=busy)


def durable_namespace(namespace: tuple[str, ...],
                      adapters: AdapterManager) -> list[Any] | None:
    """``namespace`` as it may be written to disk: adapters by their files, not by
    this process's mount serials (None: an adapter that is no longer mounted)."""
    *head, adapter_key, kv, media = namespace
    mounted = {f"{m.id}#{m.serial}": m for m in adapters.mounted.values()}
    named: list[list[Any]] = []
    for piece in filter(None, adapter_key.split("+")):
        m = mounted.get(piece)
        if m is None:
            return None
        from ..kvstore.identity import file_identity

        named.append([m.id, str(m.info.path), m.info.scale, file_identity(m.info.path)])
    return [*head, named, kv, media]
