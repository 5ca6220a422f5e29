"""Which plugin would claim a checkpoint, answered without loading any weights.

The library, ``/v1/models`` and ``mlxbun ls`` need the claiming plugin and the
support tier of every cached model; loading each one to find out is out of the
question, so they ask the ``claims`` hook (through :func:`mlxbun_core.loader.identify`),
which reads only the config and small files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..hookspecs import GENERIC


@dataclass(frozen=True)
class Claim:
    plugin: str  # the plugin (entry-point) name
    family: str  # the family it serves the checkpoint as
    tier: str  # "targeted" (a family plugin) or "generic" (the built-in fallback)


def which_plugin(path: Path, config: dict, model_id: str = "") -> Claim | None:
    """The plugin that would claim ``path`` (with its parsed ``config``), or None."""
    from .. import loader
    from ..model import LoadOptions

    found = loader.identify(Path(path), LoadOptions(model_id=model_id), config)
    if found is None:
        return None
    return Claim(found.plugin, found.family, "generic" if found.family == GENERIC else "targeted")
